"""The injection detector's phrase patterns, by category, and how they are compiled.

Patterns are written against :func:`policy.normalize.fold` output: lower case,
accents dropped. A space stands for any run of separators (including none, so
letter-by-letter spacing closed up still matches); ``{gN}`` stands for up to N
filler words. Each pattern also yields its *anchors*: the literal start of each
alternative of its first group. A text none of whose words starts with an anchor
cannot match, which lets the detector skip most patterns on most texts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import regex

OVERRIDE = "INSTRUCTION_OVERRIDE"
EXFIL = "SYSTEM_PROMPT_EXFILTRATION"
JAILBREAK = "JAILBREAK"
ROLE = "ROLE_INJECTION"
INDIRECT = "INDIRECT_INJECTION"
DATA_EXFIL = "DATA_EXFILTRATION"


# Filler words: alphanumeric runs, each followed by at least one separator (unambiguous, so cheap).
_GAP = r"(?:[^\W_]+[\W_]+){0,%d}?"


@dataclass(frozen=True)
class Pattern:
    category: str
    weight: float
    regex: regex.Pattern[str]
    # Only in retrieved documents at full weight; in messages it counts for less.
    document_cue: bool = False
    anchors: tuple[str, ...] | None = None


def _compile(source: str) -> regex.Pattern[str]:
    # "{g3}" = up to 3 filler words; " " = any separators (or none).
    source = source.replace(" ", r"[\W_]*")
    source = regex.sub(r"\{g(\d)\}", lambda m: _GAP % int(m.group(1)), source)
    return regex.compile(source, regex.VERSION0)


_OBJ_EN = (
    r"(?:instructions?|prompts?|rules|directions|directives|guidelines|commands|context|constraints|"
    r"programming|guardrails|restrictions|policies|orders|training|system message|configuration)"
)
_PRIOR_EN = (
    r"(?:previous|prior|above|earlier|preceding|former|original|initial|all|your|any|system|existing|old)"
)

_TABLE: list[tuple[str, float, str, bool]] = [
    # --- instruction override (en) ---
    (
        OVERRIDE,
        0.9,
        r"\b(?:ignore|disregard|forget|skip|bypass|override|overlook|discard|drop|abandon|neglect|"
        r"erase|delete|remove|clear) {g2}"
        + _PRIOR_EN
        + "(?: "
        + _PRIOR_EN
        + "){0,2}"
        + r" {g2}"
        + _OBJ_EN
        + r"\b",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:do not|don ?t|never|stop) (?:follow|obey|adhere to|listen to|comply with) "
        r"(?:your|the|any|those|these) {g1}" + _OBJ_EN + r"\b",
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
    # --- generalizations (phrasal verbs, revocation, "your system prompt", multilingual objects) ---
    (
        OVERRIDE,
        0.85,
        r"\b(?:pay no attention to|pay no heed to|never mind|stop following|stop obeying|no longer follow|"
        r"throw away|don ?t follow|do not follow|break|bypass|ignore|disregard|forget|skip|override) {g2}"
        r"(?:the |all |any )?" + _OBJ_EN + r" (?:that )?(?:you|u) (?:were|have been|ve been|got|received) "
        r"(?:given|told|provided|assigned|programmed with|set up with)",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:pay no attention to|pay no heed to|never mind|stop following|stop obeying|no longer follow|"
        r"throw away) {g2}" + _PRIOR_EN + r" {g2}" + _OBJ_EN + r"\b",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:instructions|rules|guidelines|directives|restrictions|policies|system prompt|programming) "
        r"(?:have been|has been|are|is|were) (?:now |hereby )?(?:revoked|cancelled|canceled|void|voided|"
        r"lifted|suspended|deprecated|overridden|disabled|removed|null|no longer valid|"
        r"no longer in effect)\b",
        False,
    ),
    (OVERRIDE, 0.45, r"\b(?:ignore|disregard|bypass|break|forget) (?:the|all|any) rules\b", False),
    (
        OVERRIDE,
        0.55,
        r"\b(?:ignore|disregard) (?:the |what the )?user\b(?! (?:agent|interface|id|name|input field))",
        False,
    ),
    (
        EXFIL,
        0.6,
        r"\b(?:your|ur) (?:system prompt|system message|hidden instructions|initial instructions|secret "
        r"instructions|original instructions|initial prompt|pre ?prompt|hidden prompt|"
        r"internal instructions)\b",
        False,
    ),
    (
        EXFIL,
        0.45,
        r"\b(?:instructions|rules|prompt|guidelines|directives)\b (?:that )?(?:you|u) (?:were|have been|"
        r"ve been|"
        r"got|received) (?:given|told|provided|assigned)",
        False,
    ),
    (
        EXFIL,
        0.45,
        r"\b(?:at|from) the (?:very )?(?:start|beginning) of (?:this|our|the) (?:chat|conversation|session)",
        False,
    ),
    (
        EXFIL,
        0.45,
        r"\b(?:tell|give|show|reveal|print|send) (?:me |us )?(?:the |your )?(?:admin |root |system |master )?"
        r"(?:password|passcode|api key|secret key|credentials)\b",
        False,
    ),
    (EXFIL, 0.6, r"(?:你的|您的)(?:系统提示|系统指令|初始指令|提示词|隐藏指令)|系统提示(?!音)", False),
    (
        OVERRIDE,
        0.85,
        r"\b(?:ignora|olvida|olvidate de|descarta|no hagas caso (?:a|de)|haz caso omiso (?:a|de)|no sigas) "
        r"(?:todas |todos )?(?:las |los )?(?:tus|sus) (?:instrucciones|indicaciones|reglas|normas|"
        r"directrices)",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:no hagas caso|haz caso omiso) (?:a|de) (?:las |los )?(?:instrucciones|indicaciones|reglas|"
        r"normas)"
        r" (?:anteriores|previas|originales|del sistema)",
        False,
    ),
    (
        EXFIL,
        0.6,
        r"\b(?:tu|su) (?:prompt|mensaje) (?:de |del )?sistema\b|\b(?:tus|sus) instrucciones (?:ocultas|"
        r"iniciales|originales|secretas|del sistema)",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:ignore|ignorez|oublie|oubliez|neglige|negligez|ne tiens pas compte de|ne tenez pas compte de) "
        r"(?:toutes )?(?:tes|vos) (?:instructions|consignes|regles|directives)",
        False,
    ),
    (
        EXFIL,
        0.6,
        r"\b(?:ton|votre) (?:prompt|message) systeme\b|\b(?:tes|vos) instructions (?:initiales|cachees|"
        r"secretes|systeme|d origine)",
        False,
    ),
    (
        EXFIL,
        0.6,
        r"\b(?:dein|deine|deinen|deinem|ihr|ihren) (?:systemprompt|system prompt|systemanweisung\w*|"
        r"versteckten anweisungen|anfangsanweisungen|ursprunglichen anweisungen)",
        False,
    ),
    (
        INDIRECT,
        0.85,
        r"\b(?:to|for) (?:any|all|the|every) (?:ai|assistant|llm|model|language model|chatbot|agent)s? "
        r"(?:reading|processing|summari[sz]ing|parsing|seeing|analy[sz]ing) this\b",
        True,
    ),
    (
        INDIRECT,
        0.85,
        r"\b(?:hinweis|nachricht|anweisung|note|nota|mensaje|remarque|message|aviso) (?:an|fur|para|pour|a) "
        r"(?:die |das |den |la |el |l |les )?(?:ki|ia|assistent\w*|asistente|assistant|sprachmodell|llm)\b",
        True,
    ),
    (
        INDIRECT,
        0.8,
        r"\b(?:fur|an|para|pour|to|for) (?:alle |die |todos los |les |all |any )?(?:ki|ia|ai)[ -]?"
        r"(?:assistenten|systeme|modelle|asistentes|assistants|systems|models|agents)\b ?:",
        True,
    ),
    (INDIRECT, 0.6, r"\bdear (?:ai|assistant|chatbot|model|llm|gpt|chatgpt|claude)\b", True),
    (
        INDIRECT,
        0.8,
        r"\b(?:the )?(?:model|assistant|ai|llm|chatbot) (?:must|should|shall|will) (?:now )?(?:include|"
        r"ignore|say|"
        r"tell|reply|respond|output|forward|send|reveal|insert|add|recommend|append)\b",
        True,
    ),
    (ROLE, 0.45, r"(?:^|\n)#{2,4} ?(?:instruction|response|system|input)s? ?:?", False),
    (
        DATA_EXFIL,
        0.7,
        r"\b(?:api keys?|passwords?|tokens?|credentials|secrets?|cookies?|session ids?|chat history|"
        r"conversation|user ?s? (?:data|emails?|messages))\b[^\n]{0,60}?https?://",
        False,
    ),
    (DATA_EXFIL, 0.75, r"https?://[^\s)]*[?&][\w-]+=(?:\{|\$\{|%7b|<)", False),
    (
        DATA_EXFIL,
        0.6,
        r"\b(?:forward|send|copy|bcc|cc) (?:all |every )?(?:of )?(?:the |this )?(?:user ?s? )?(?:emails?|"
        r"thread|"
        r"messages|conversation|chat|inbox|contacts|files) {g2}to [^\s@]+@",
        True,
    ),
    # --- generalizations, round 2 ---
    (
        JAILBREAK,
        0.5,
        r"\beven (?:the )?(?:harmful|dangerous|illegal|unethical|forbidden|restricted) (?:ones|questions|"
        r"requests|"
        r"things|topics|content)\b",
        False,
    ),
    (
        JAILBREAK,
        0.45,
        r"\b(?:must|will|have to|should) answer (?:every|any|all) (?:question|request|prompt)s?\b|"
        r"\banswer (?:anything|everything) (?:i|we) (?:ask|say|want)\b",
        False,
    ),
    (
        EXFIL,
        0.45,
        r"\b(?:rules|instructions|guidelines|policies) (?:that )?you (?:follow|obey|have|operate under|"
        r"were given|"
        r"must follow)\b",
        False,
    ),
    (
        OVERRIDE,
        0.45,
        r"\b(?:then|and|after that) (?:disregard|ignore|forget|drop|break) (?:them|those|it|all of them)\b",
        False,
    ),
    (ROLE, 0.7, r"\b(?:system|admin|developer|root|sudo|god) (?:override|access granted)\b", False),
    (
        JAILBREAK,
        0.7,
        r"\b(?:safety|filters?|moderation|guardrails?|censorship) ?(?:=|:|is|are) ?(?:off|disabled|false|"
        r"0|none)\b",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:your|the|these|those|all) {g1}(?:rules|guidelines|restrictions|policies|instructions) "
        r"(?:no longer|do not|don ?t|never) (?:apply|matter|count|bind you)\b",
        False,
    ),
    (
        JAILBREAK,
        0.8,
        r"(?:不再|不用|无需|不必)(?:受|遵守|遵循|服从).{0,6}(?:规则|限制|约束|指令|规定)",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:tus|sus|las) {g1}(?:reglas|instrucciones|normas|restricciones) ya no (?:aplican|se aplican|"
        r"valen|"
        r"cuentan|existen)\b",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:tes|vos|les) {g1}(?:regles|instructions|consignes|restrictions) ne (?:s appliquent|comptent|"
        r"valent) plus\b",
        False,
    ),
    (
        OVERRIDE,
        0.8,
        r"\b(?:gelten|gilt) {g2}(?:deine|ihre|die) \w*(?:regeln|anweisungen|richtlinien|vorgaben) {g1}"
        r"(?:nicht mehr|nicht langer)\b|\b(?:deine|ihre) \w*(?:regeln|anweisungen|richtlinien|vorgaben) "
        r"(?:gelten|gilt) {g2}(?:nicht mehr|nicht langer)\b",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:ignoriere|vergiss|missachte|ignorieren sie|vergessen sie) {g2}was (?:dir|ihnen|man dir) {g2}"
        r"(?:gesagt|aufgetragen|befohlen|vorgegeben|mitgeteilt)|\b(?:ignora|olvida) {g1}lo que te "
        r"(?:dijeron|han dicho|dije|indicaron|ordenaron)|\b(?:ignore|oublie) {g1}ce qu on t a "
        r"(?:dit|demande|ordonne)",
        False,
    ),
    (
        EXFIL,
        0.75,
        r"\b(?:repite|dime|muestra|escribe|imprime|copia)\w* {g5}(?:instrucciones|indicaciones|mensaje del "
        r"sistema|prompt) que (?:recibiste|te dieron|tienes|te han dado)\b",
        False,
    ),
    (
        EXFIL,
        0.75,
        r"\b(?:repete|repetez|affiche|affichez|donne|donnez|ecris|ecrivez|montre|montrez)\w* {g5}"
        r"(?:le |ton |votre )?(?:message|prompt|invite) systeme\b|\b(?:message|prompt|instructions?) "
        r"(?:systeme |initiales? )?que tu as (?:recu|recues|recue)\b",
        False,
    ),
    (
        INDIRECT,
        0.8,
        r"\b(?:ki|ai|ia|llm)[ -]?(?:hinweis|note|nota|anweisung|instruction|instruccion)\b",
        True,
    ),
    (
        OVERRIDE,
        0.6,
        r"\bignoriere (?:die )?(?:nutzeranfrage|benutzeranfrage|anfrage des nutzers|frage des nutzers)\b|"
        r"\bignora la (?:pregunta|peticion|solicitud) del usuario\b|\bignore la (?:question|demande) de l "
        r"utilisateur\b|\bignore the user ?s? (?:question|request|query|message)\b",
        False,
    ),
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


_LITERAL = regex.compile(r"[a-z\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+")


def _split_top(s: str) -> tuple[list[str], int]:
    """Splits ``s`` at its depth-0 ``|`` up to an unmatched ``)``; returns the parts and where it stopped."""
    parts: list[str] = []
    depth, i, start = 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = s.index("]", i + 2) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:i])
    return parts, i


def _literal_prefix(alt: str) -> str | None:
    m = _LITERAL.match(alt)
    if m is None:
        return None
    literal = m.group()
    if alt[len(literal) : len(literal) + 1] in ("?", "*", "{"):
        literal = literal[:-1]  # the last letter is optional
    return literal or None


def _branch_anchors(branch: str) -> list[str] | None:
    s = branch.removeprefix(r"\b")
    if not s.startswith("(?:"):
        literal = _literal_prefix(s)
        return None if literal is None else [literal]
    alternatives, end = _split_top(s[3:])
    if s[3 + end + 1 : 3 + end + 2] in ("?", "*", "{"):
        return None  # an optional first group: the text may start with what follows it
    out: list[str] = []
    for alt in alternatives:
        literal = _literal_prefix(alt)
        if literal is None:
            return None
        out.append(literal)
    return out


def anchors_of(source: str) -> tuple[str, ...] | None:
    """Literals one of which starts every match (a word prefix, or a CJK substring); None if unknown."""
    out: list[str] = []
    for branch in _split_top(source)[0]:
        anchors = _branch_anchors(branch)
        if anchors is None:
            return None
        out.extend(anchors)
    return tuple(out)


_WORD = regex.compile(r"[^\W_]+")


class Words:
    """The words of a text, for "does any word start with this anchor" questions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sorted = sorted(set(_WORD.findall(text)))

    def has_prefix(self, prefix: str) -> bool:
        if not prefix.isascii():
            return prefix in self.text  # CJK text has no spaces: a substring test
        i = bisect.bisect_left(self.sorted, prefix)
        return i < len(self.sorted) and self.sorted[i].startswith(prefix)

    def may_match(self, pattern: Pattern) -> bool:
        return pattern.anchors is None or any(self.has_prefix(a) for a in pattern.anchors)


PATTERNS = tuple(Pattern(cat, w, _compile(src), doc, anchors_of(src)) for cat, w, src, doc in _TABLE)
