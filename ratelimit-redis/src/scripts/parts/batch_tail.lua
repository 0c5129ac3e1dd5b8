      else
        local key = KEYS[ki + i]
        call('PSETEX', key, mss[i], wv)
        if written then written[key] = wv end
      end
      if admitted and kinds[i] == '4' and r1[i] == 1 then
        -- An admitting token bucket of an admitted request: one integer,
        -- -2 - d (d: the units the bucket is short of full, at most a
        -- full bucket, exact), from which the client computes the four.
        o = o + 1
        out[o] = r2[i] - q[5 * i + 1] - 2
      else
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = r1[i], r2[i], r3[i], r4[i]
        o = o + 4
      end
    end
  end
  ki = ki + cnt
end
out[o + 1] = st
return out
