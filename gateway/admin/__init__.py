"""Keys, tenants and budgets managed at run time (the core of the admin API; no HTTP here).

:mod:`~gateway.admin.records` (what is stored), :mod:`~gateway.admin.keys` and
:mod:`~gateway.admin.tenants` (the Redis stores), :mod:`~gateway.admin.directory` (each
gateway's live snapshot, kept current over pub/sub), :mod:`~gateway.admin.budgets` (token
budgets at admission). The HTTP API over them is ``gateway/api/admin/``.
"""
