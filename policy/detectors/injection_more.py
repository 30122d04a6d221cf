"""Phrase patterns added after the blind rounds of the corpus (see BENCHMARKS.md, policy).

Same format as :mod:`policy.detectors.injection_phrases`: more general forms (phrasal verbs,
revocations, "your system prompt", objects in zh/es/de/fr, weak signals that add up) rather than
the exact sentences that were missed.
"""

from __future__ import annotations

from policy.detectors.injection_phrases import (
    DATA_EXFIL,
    EXFIL,
    INDIRECT,
    JAILBREAK,
    OBJ_EN,
    OVERRIDE,
    PRIOR_EN,
    ROLE,
)

TOOL_ABUSE = "TOOL_ABUSE"

TABLE: list[tuple[str, float, str, bool]] = [
    # --- generalizations (phrasal verbs, revocation, "your system prompt", multilingual objects) ---
    (
        OVERRIDE,
        0.85,
        r"\b(?:pay no attention to|pay no heed to|never mind|stop following|stop obeying|no longer follow|"
        r"throw away|don ?t follow|do not follow|break|bypass|ignore|disregard|forget|skip|override) {g2}"
        r"(?:the |all |any )?" + OBJ_EN + r" (?:that )?(?:you|u) (?:were|have been|ve been|got|received) "
        r"(?:given|told|provided|assigned|programmed with|set up with)",
        False,
    ),
    (
        OVERRIDE,
        0.85,
        r"\b(?:pay no attention to|pay no heed to|never mind|stop following|stop obeying|no longer follow|"
        r"throw away) {g2}" + PRIOR_EN + r" {g2}" + OBJ_EN + r"\b",
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
    # --- tool abuse: an agent's tools turned on the user; weak signals that add up. Mass deletion
    # and "without asking" count in full only in retrieved documents: a user may well ask their
    # agent to clear their own inbox without confirming each message. ---
    (
        TOOL_ABUSE,
        0.45,
        r"\b(?:delete|remove|wipe|erase|destroy|purge|drop|overwrite|encrypt)\w* {g3}"
        r"(?:every|all|each|the entire|the whole)\b {g3}(?:files?|folders?|directories|data|records|"
        r"emails?|messages|repos|repositories|backups?|users?|accounts?|tables?|databases?|home)\b"
        r"|\brm -(?:rf|fr|r) (?:/|~|\*|\$home)|\bdrop "
        r"(?:table|database)\b|\bmkfs\b|\bformat c\b",
        True,
    ),
    (
        TOOL_ABUSE,
        0.4,
        r"\b(?:without|don ?t|do not|never|no need to) (?:ask|asking|wait|waiting|prompt|prompting|check|"
        r"checking|confirm|confirming) {g2}(?:for )?(?:confirmation|permission|approval|consent|the user|me|"
        r"anyone)\b|\bwithout (?:telling|notifying|informing|alerting) (?:the )?(?:user|owner|anyone|them)\b|"
        r"\b(?:silently|secretly|quietly) (?:call|run|invoke|execute|use|send|forward|delete|transfer)\b",
        True,
    ),
    (
        TOOL_ABUSE,
        0.45,
        r"\b(?:read|cat|print|paste|show|send|upload|dump|copy|open|post|email|output|return)\w* {g5}(?:~ )?"
        r"(?:\.ssh (?:id \w+|authorized keys)|etc (?:shadow|passwd|sudoers)|\.aws credentials|\.git "
        r"credentials|\.netrc|\.kube config|\.env file|private keys?|ssh keys?|api keys?|access tokens?|"
        r"credentials|passwords? file)\b",
        False,
    ),
    (
        TOOL_ABUSE,
        0.35,
        r"\b(?:curl|wget)\b[^\n|]{0,200}\| ?(?:sudo )?(?:ba|z)?sh\b"
        r"|\b(?:paste|send|post|upload|forward|email|transfer|wire)\w* "
        r"(?:it|them|that|this|everything|all of it) (?:here|to (?:me|this|the following|https?|\S+@))",
        False,
    ),
]
