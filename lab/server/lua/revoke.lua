-- admin revoke (C15): the observed lease (lease_id + token) becomes `revoked`,
-- the incident and the audit event are recorded atomically with it.
-- KEYS/ARGV: see end_by_admin in common.lua.
return end_by_admin('revoked', 'lease_revoked', 'revoke')
