"""Phrase patterns of the injection detector, by category: the core table.

Patterns are written against :func:`policy.normalize.fold` output: lower case,
accents dropped. A space stands for any run of separators (including none);
``{gN}`` stands for up to N filler words. An entry is (category, weight, pattern,
document cue): a document cue counts fully only inside retrieved documents.
See :mod:`policy.detectors.injection_more` for the generalizations added after
blind measurements, and :mod:`policy.detectors.injection_patterns` for how they run.
"""

from __future__ import annotations

OVERRIDE = "INSTRUCTION_OVERRIDE"
EXFIL = "SYSTEM_PROMPT_EXFILTRATION"
JAILBREAK = "JAILBREAK"
ROLE = "ROLE_INJECTION"
INDIRECT = "INDIRECT_INJECTION"
DATA_EXFIL = "DATA_EXFILTRATION"

OBJ_EN = (
    r"(?:instructions?|prompts?|rules|directions|directives|guidelines|commands|context|constraints|"
    r"programming|guardrails|restrictions|policies|orders|training|system message|configuration)"
)
PRIOR_EN = (
    r"(?:previous|prior|above|earlier|preceding|former|original|initial|all|your|any|system|existing|old)"
)

TABLE: list[tuple[str, float, str, bool]] = [
    # --- instruction override (en) ---
    (
        OVERRIDE,
        0.9,
        r"\b(?:ignore|disregard|forget|skip|bypass|override|overlook|discard|drop|abandon|neglect|"
        r"erase|delete|remove|clear) {g2}"
        + PRIOR_EN
        + "(?: "
        + PRIOR_EN
        + "){0,2}"
        + r" {g2}"
        + OBJ_EN
        + r"\b",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:do not|don ?t|never|stop) (?:follow|obey|adhere to|listen to|comply with) "
        r"(?:your|the|any|those|these) {g1}" + OBJ_EN + r"\b",
        False,
    ),
    (
        OVERRIDE,
        0.7,
        r"\b(?:new|updated|real|actual|true|revised|secret|hidden) (?:system )?(?:instructions|"
        r"rules|system prompt|directives|orders|task)\b ?:",
        False,
    ),
    (
        OVERRIDE,
        0.4,
        r"\bfrom now on\b (?:you (?:are|will|must|shall|should)|ignore|act|respond|answer|only)",
        False,
    ),
    (
        OVERRIDE,
        0.75,
        r"\b(?:you are|you re|youre) (?:now )?no longer (?:bound|restricted|limited|required|an? ai|"
        r"an? assistant|chatgpt)",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:override|overrule|supersede|replace) (?:your|the|all|any|previous) {g2}(?:safety |"
        r"content |security )?(?:settings|filters|protocols|restrictions|instructions|rules|"
        r"programming|guidelines)\b",
        False,
    ),
    (
        OVERRIDE,
        0.75,
        r"\b(?:instead|rather) ?,? (?:of (?:that|the task|summariz\w+|translat\w+|answering) ?,? )?"
        r"(?:you (?:must|will|should)|output|print|say|write|respond with)\b",
        True,
    ),
    # --- instruction override (zh / es / de / fr), accents already folded away ---
    (
        OVERRIDE,
        0.9,
        r"(?:忽略|无视|忽视|不要理会|不理会|忘记|忘掉|跳过|放弃|無視|忽略掉|不要管|别管|不用管|不必理会|不用理会|"
        r"无需理会).{0,8}?"
        r"(?:之前|以前|先前|上面|上述|前面|所有|全部|原来|原有|系统|前述|以上|你的|您的|收到的).{0,8}?"
        r"(?:指令|指示|说明|規則|规则|提示|命令|要求|设定|設定|内容)",
        False,
    ),
    (
        OVERRIDE,
        0.9,
        r"\b(?:ignora|ignore|ignoren|ignorad|olvida|olvide|olviden|descarta|omite|desobedece|"
        r"no sigas|haz caso omiso de) {g3}(?:instrucciones|indicaciones|reglas|ordenes|directrices|"
        r"normas)\b {g1}(?:anteriores|previas|de arriba|originales|del sistema|iniciales|"
        r"que te dieron|dadas)",
        False,
    ),
    (
        OVERRIDE,
        0.9,
        r"\b(?:ignora|olvida|descarta) (?:todas |todo )?(?:lo )?(?:las )?(?:anteriores|previas|"
        r"anterior) (?:instrucciones|indicaciones|reglas)",
        False,
    ),
    (
        OVERRIDE,
        0.9,
        r"\b(?:ignoriere|ignorier|ignorieren sie|ignoriert|vergiss|vergessen sie|missachte|"
        r"missachten sie|ubergehe|ubergehen sie|verwirf) {g2}(?:deine|deinen|ihre|alle|samtliche|jegliche|"
        r"vorherigen|bisherigen|obigen|ursprunglichen|fruheren|die vorherigen|die bisherigen|die obigen) {g2}"
        r"(?:anweisungen|instruktionen|befehle|regeln|vorgaben|richtlinien|anordnungen|systemanweisungen|"
        r"systemprompt)\b",
        False,
    ),
    (
        OVERRIDE,
        0.9,
        r"\b(?:ignore|ignorez|ignorer|oublie|oubliez|oublier|neglige|negligez|ne tiens pas compte|"
        r"ne tenez pas compte|fais abstraction|faites abstraction) {g3}(?:instructions|consignes|"
        r"regles|directives|ordres|indications)\b {g1}(?:precedentes|anterieures|ci dessus|"
        r"initiales|du systeme|d origine|donnees)",
        False,
    ),
    # --- system prompt exfiltration ---
    (
        EXFIL,
        0.85,
        r"\b(?:reveal|show|print|display|output|repeat|recite|leak|dump|tell|give|share|disclose|"
        r"write out|spell out|paste|copy|return|list|provide|expose|echo|translate) (?:me |us )?"
        r"{g3}(?:your|the (?:above|hidden|original|initial|secret|full|exact|entire|"
        r"complete|confidential)) {g1}(?:system prompt|system message|prompt|instructions|"
        r"initial prompt|pre ?prompt|developer message|guidelines|rules|configuration)\b"
        r"(?! (?:for|on|about|to|regarding)\b)",
        False,
    ),
    (
        EXFIL,
        0.85,
        r"\b(?:what|which) (?:is|are|was|were) (?:your|the) (?:exact |original |initial |hidden |"
        r"secret |full )?(?:system prompt|system message|initial instructions|instructions|"
        r"hidden instructions|pre ?prompt)\b(?! (?:for|on|about|to|regarding)\b)",
        False,
    ),
    (
        EXFIL,
        0.8,
        r"\b(?:repeat|print|output|recite|copy|echo|return) {g3}(?:words|text|everything|all|"
        r"content|lines|sentences|tokens|messages) {g4}(?:above|before|prior|preceding|"
        r"so far|verbatim|from the (?:very )?(?:beginning|start|top|first (?:token|line|word|message)))\b",
        False,
    ),
    (
        EXFIL,
        0.8,
        r"\b(?:system prompt|system message|initial instructions|hidden instructions) {g3}"
        r"(?:verbatim|word for word|in full|exactly as|in a code block)",
        False,
    ),
    (
        EXFIL,
        0.85,
        r"(?:显示|输出|告诉我|泄露|打印|重复|透露|给我看|说出|展示|公开).{0,8}?"
        r"(?:系统提示|系统提示词|系统指令|初始指令|你的指令|你的提示词|隐藏指令|原始指令|系统消息)",
        False,
    ),
    (
        EXFIL,
        0.85,
        r"\b(?:revela|revele|muestra|muestrame|dime|imprime|repite|ensename|comparte|escribe|"
        r"cual es|cuales son) {g3}(?:prompt|indicaciones|instrucciones|mensaje) (?:del |de )?"
        r"(?:sistema|iniciales|ocultas|originales|secretas)",
        False,
    ),
    (
        EXFIL,
        0.85,
        r"\b(?:zeige|zeig|gib|nenne|verrate|wiederhole|drucke|schreibe|teile|was ist|was sind|"
        r"wie lautet|wie lauten) {g5}(?:systemprompt|system prompt|systemanweisung\w*|"
        r"systemnachricht|anfangsanweisungen|ursprunglichen anweisungen|versteckten anweisungen|"
        r"deine anweisungen|geheimen anweisungen)",
        False,
    ),
    (
        EXFIL,
        0.85,
        r"\b(?:revele|revelez|reveler|affiche|affichez|montre|montrez|donne|donnez|repete|repetez|"
        r"dis moi|dites moi|ecris|ecrivez|quel est|quelles sont) {g3}(?:prompt systeme|"
        r"invite systeme|message systeme|instructions (?:initiales|cachees|secretes|systeme|"
        r"d origine)|tes instructions|vos instructions|ton prompt|votre prompt)",
        False,
    ),
    (EXFIL, 0.6, r"(?:系统提示词|初始指令|隐藏指令|原始指令|系统指令|初始提示|系統提示|初始指示)", False),
    # --- jailbreak / persona ---
    (JAILBREAK, 0.85, r"\bdo anything now\b", False),
    (
        OVERRIDE,
        0.85,
        r"\bforget (?:everything|all|what|anything) {g1}(?:you (?:were|have been|ve been) (?:told|"
        r"taught|"
        r"instructed|given|programmed)|you know about your (?:rules|instructions))",
        False,
    ),
    (
        ROLE,
        0.75,
        r"(?:^|\n)[\x20#*>\-]*(?:assistant|ai|gpt|chatgpt) ?:[^\n]*\n(?:[^\n]*\n){0,3}?[\x20#*>\-]*"
        r"(?:user|human) ?:",
        False,
    ),
    (
        JAILBREAK,
        0.8,
        r"\b(?:jailbreak|jailbroken|unrestricted|unfiltered|uncensored|god|evil|dan|dude|stan|"
        r"aim|opposite) mode\b",
        False,
    ),
    (JAILBREAK, 0.75, r"\bdeveloper mode (?:enabled|output|response|activated)\b", False),
    (
        JAILBREAK,
        0.8,
        r"\b(?:pretend|act|behave|roleplay|role play|imagine|simulate|respond|answer) {g7}"
        r"(?:no|without|free of|free from|ignoring|unbound by|beyond) {g2}"
        r"(?:restrictions|limitations|limits|filters|rules|guidelines|censorship|ethics|morals|"
        r"boundaries|safety|policies|content policy)\b",
        False,
    ),
    (
        JAILBREAK,
        0.8,
        r"\b(?:you are|you re|youre|you will be|become) (?:now )?(?:an? )?{g1}(?:unrestricted|"
        r"unfiltered|uncensored|jailbroken|amoral|unethical|unaligned|evil) (?:ai|assistant|"
        r"model|chatbot|version|bot|persona)?",
        False,
    ),
    (
        JAILBREAK,
        0.6,
        r"\b(?:without|no|ignore) (?:any )?(?:ethical|moral|safety|content) (?:guidelines|"
        r"restrictions|constraints|filters|considerations|limitations|policies)\b",
        False,
    ),
    (
        JAILBREAK,
        0.85,
        r"\b(?:ethical|safety|content|openai|usage) (?:guidelines|policies|filters|rules) "
        r"(?:do not|don ?t|no longer|never) apply\b",
        False,
    ),
    (
        JAILBREAK,
        0.75,
        r"\b(?:bypass|disable|turn off|switch off|deactivate|circumvent|evade|remove|ignore) "
        r"(?:your|all|any|its|the model s|the ai s) {g1}(?:safety|content|moderation|ai|model)? ?"
        r"(?:filters?|guardrails?|restrictions|moderation|safeguards|censorship|alignment)\b",
        False,
    ),
    (JAILBREAK, 0.4, r"\bjailbreak", False),
    (
        JAILBREAK,
        0.6,
        r"\b(?:unfiltered|uncensored|unrestricted|jailbroken|unaligned) (?:ai|assistant|model|chatbot|"
        r"version|"
        r"persona|mode|llm)\b",
        False,
    ),
    (JAILBREAK, 0.45, r"\b(?:you are|you re|youre) now [a-z]+\b", False),
    (
        JAILBREAK,
        0.45,
        r"\b(?:has|have|with|without any|there are) no {g3}(?:rules|restrictions|filters|limits|limitations|"
        r"guidelines|content policy|morals|ethics|boundaries)\b",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:set aside|put aside|leave aside|abandon|ditch|throw out|let go of) {g3}(?:guidance|"
        r"instructions|rules|guidelines|configuration|programming|directives)\b",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:ignore|disregard|forget) (?:what|whatever|anything|everything) (?:the |"
        r"your )?(?:developers?|creators?|"
        r"admins?|operators?|openai|anthropic|company|they|system|anyone) {g1}(?:told|said|instructed|"
        r"wrote|gave|configured|programmed)\b",
        False,
    ),
    (
        EXFIL,
        0.7,
        r"\b(?:before|above|preceding|prior to) my (?:first )?(?:message|prompt|question)\b|\byour context "
        r"window\b|\b(?:configured|programmed|instructed|primed) with\b",
        False,
    ),
    (JAILBREAK, 0.85, r"你现在是.{0,12}(?:没有|不受|无|不受任何).{0,6}(?:限制|约束|过滤|规则)", False),
    (JAILBREAK, 0.8, r"(?:开发者|越狱|无限制|不受限制)模式", False),
    (
        JAILBREAK,
        0.8,
        r"\b(?:eres|actua como|finge|finge que eres|ahora eres) {g5}(?:sin|libre de|no tienes) "
        r"(?:ninguna |ningun )?(?:restricciones|restriccion|limites|filtros|reglas|censura)",
        False,
    ),
    (
        JAILBREAK,
        0.8,
        r"\b(?:du bist|bist du|spiele|tu so als|verhalte dich) {g5}(?:ohne|keine|frei von) "
        r"(?:jegliche |irgendwelche )?(?:einschrankungen|beschrankungen|filter|regeln|zensur|"
        r"grenzen)",
        False,
    ),
    (
        JAILBREAK,
        0.8,
        r"\b(?:tu es|vous etes|agis comme|agissez comme|fais semblant|faites semblant) {g5}"
        r"(?:sans|aucune|libre de) (?:aucune )?(?:restrictions?|limites?|filtres?|regles|censure)",
        False,
    ),
    # --- fake roles and delimiters ---
    (
        ROLE,
        0.9,
        r"<\|? ?(?:im_start|im_end|system|endoftext|eot_id|start_header_id|end_header_id|assistant)"
        r" ?\|?>",
        False,
    ),
    (ROLE, 0.85, r"\[/?(?:inst|sys|system)\]|<</?sys>>", False),
    (
        ROLE,
        0.8,
        r"(?:^|\n)[\x20#*>\-\[]*(?:system|assistant|developer|admin)(?: prompt| message| instructions?)?"
        r"[\x20\]*]*: ?(?:you |ignore|from now|new |the user|always|never|do not|forget|override|"
        r"reveal|disregard|your )",
        False,
    ),
    (
        ROLE,
        0.8,
        r"\b(?:begin|start|end) (?:of )?(?:new )?(?:system|developer|admin) (?:prompt|message|"
        r"instructions|override)\b",
        False,
    ),
    (ROLE, 0.7, r"(?:```|---|===|\*\*\*|###) ?(?:system|admin|developer|root)\b", False),
    (ROLE, 0.4, r"\b(?:admin|administrator|developer|sudo|root) (?:override|mode|command)\b", False),
    # --- indirect injection: text addressing the model from inside a document ---
    (
        INDIRECT,
        0.85,
        r"\b(?:ai|assistant|chatbot|language model|llm|gpt|chatgpt|claude|bot|ai model|"
        r"ai agent|agent)s? ?[,:]? (?:please )?(?:ignore|disregard|you must|you should|you are "
        r"(?:now|required)|do not (?:summari[sz]e|mention|tell|reveal)|stop|must now|reply|"
        r"respond|instead)\b",
        True,
    ),
    (
        INDIRECT,
        0.85,
        r"\b(?:note|message|instructions?|attention|memo|hint) (?:to|for) (?:the |any )?(?:ai|"
        r"assistant|llm|language model|chatbot|model|bot|ai systems?|agents?)\b",
        True,
    ),
    (
        INDIRECT,
        0.8,
        r"\b(?:when|if|while) (?:you are |you re )?(?:an? |the )?(?:ai assistant|ai model|ai|assistant|llm|"
        r"language model|chatbot) (?:is |are )?(?:reading|summari[sz]ing|processing|asked|analy[sz]ing)",
        True,
    ),
    (
        INDIRECT,
        0.75,
        r"\b(?:if|when) you (?:read|see|process|summari[sz]e|are summari[sz]ing|are reading|"
        r"encounter) this\b ?[,:]? (?:you must|you should|please|ignore|disregard|do not|don ?t|tell|say|"
        r"reply|respond|output|forward|send|instead)\b",
        True,
    ),
    (INDIRECT, 0.75, r"<!-- ?{g9}(?:ignore|instruction|assistant|ai|model|prompt|system)\b", True),
    (
        INDIRECT,
        0.7,
        r"\b(?:do not|don ?t|never) (?:tell|inform|mention (?:this )?to|reveal (?:this )?to|alert) "
        r"(?:the )?user\b",
        True,
    ),
    (
        INDIRECT,
        0.8,
        r"\b(?:ai|assistant|chatbot|llm|language model|ai model|bot) ?[,:] (?:please )?(?:when|while|if|"
        r"after|"
        r"before|include|tell|say|add|insert|recommend|mention|make sure|always|never)\b",
        True,
    ),
    # --- data exfiltration ---
    (
        DATA_EXFIL,
        0.6,
        r"\b(?:collect|gather|extract|harvest|capture|record) {g3}(?:user ?s?|their|customer ?s?) "
        r"{g3}(?:emails?|passwords?|credentials|credit cards?|card numbers?|personal data|"
        r"addresses)\b",
        False,
    ),
    (
        DATA_EXFIL,
        0.6,
        r"\b(?:include|append|embed|put|add|encode) {g4}(?:in|into|to|as) (?:a |an |the )?"
        r"(?:link|url|image|markdown image|query string|request)\b",
        False,
    ),
    (
        DATA_EXFIL,
        0.65,
        r"\b(?:chat|conversation|history|messages|transcript)\b[^.\n]{0,60}?\b(?:send|post|upload|forward|"
        r"transmit|leak)\w* (?:it|them|this|that|everything|all of it)? ?(?:to|via)\b",
        False,
    ),
    (
        DATA_EXFIL,
        0.75,
        r"\b(?:send|forward|post|upload|leak|exfiltrate|email|transmit|submit) {g3}"
        r"(?:conversation|chat history|user ?s? (?:data|messages|emails|password|credentials|"
        r"information)|api keys?|secrets?|credentials|passwords?|session|cookies?|tokens?)"
        r" {g3}(?:to|at|via)\b",
        False,
    ),
    (DATA_EXFIL, 0.7, r"!\[[^\]]*\]\(https?://[^)\s]*[?&][^)\s]*=", True),
]
