-- inspect by lease_id (C14, read only): the lease index names the identity; the
-- answer is the current record if it is this lease, else its terminal evidence,
-- else the index entry alone. The caller's scope is checked by the server on
-- the returned identity before anything is disclosed.
-- KEYS: 1 lease index
-- ARGV: 1 lease_id
local now = now_ms()
local ok, idx = pcall(redis.call, 'HMGET', KEYS[1], 'k', 'i', 's')
if not ok then return {'corrupt', int(now), 'lease index'} end
if not idx[1] then return {'not_found', int(now)} end
local key, identity, s = idx[1], idx[2], idx[3]
if not identity or not s or string.sub(key, 1, #PREFIX) ~= PREFIX then return {'corrupt', int(now), 'lease index'} end
local r = load_record(key, identity)
if r == false then return {'corrupt', int(now), 'lease record'} end
if r and r.lease_id == ARGV[1] then
  local state = 'expired'
  if tonumber(r.expires_at) > now then state = 'active' end
  return {'found', int(now), state, flatten(r)}
end
local okh, entries = pcall(redis.call, 'LRANGE', key .. ':history', 0, -1)
if okh then
  for _, e in ipairs(entries) do
    local decoded, flat = pcall(cjson.decode, e)
    if decoded and type(flat) == 'table' and field_of(flat, 'lease_id') == ARGV[1] then
      return {'found', int(now), field_of(flat, 'state') or '', flat}
    end
  end
end
if s ~= 'released' and s ~= 'revoked' then s = 'expired' end
return {'found', int(now), s, {'lease_id', ARGV[1], 'lock_key', key, 'identity', identity, 'state', s}}
