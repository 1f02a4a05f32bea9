-- admin force-release (C15): the observed lease (lease_id + token) becomes
-- `released`, the reason and the audit event are recorded atomically with it.
-- KEYS/ARGV: see end_by_admin in common.lua.
return end_by_admin('released', 'lease_released', 'force_release')
