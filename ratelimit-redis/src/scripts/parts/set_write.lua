-- A string state: one SET with its expiry.
call('SET', key, wv, 'PX', ms)
