-- A string state: one write with its expiry (PSETEX: SET ... PX without
-- the option parsing).
call('PSETEX', key, ms, wv)
