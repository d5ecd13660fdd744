-- Appends a relayed message to its endpoint's stream (spread layout: the
-- commit left it on its partition's relay stream), unless the endpoint
-- is full (lib/endpoint_room.lua): then it stays on the relay stream,
-- and housekeeping relays it once there is room.
--
-- KEYS[1]: the endpoint's stream
-- ARGV[1]: the envelope
-- ARGV[2]: the endpoint streams' cap
-- Returns: the entry id, or {ENDPOINT_FULL}.
local stream = KEYS[1]
local envelope = ARGV[1]
local cap = ARGV[2]

if endpoint_full(stream, cap) then return {ENDPOINT_FULL} end
return endpoint_append(stream, cap, envelope)
