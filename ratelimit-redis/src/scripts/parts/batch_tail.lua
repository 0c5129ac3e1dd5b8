      else
        local key = KEYS[ki + i]
        call('PSETEX', key, mss[i], wv)
        if written then written[key] = wv end
      end
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = r1[i], r2[i], r3[i], r4[i]
      o = o + 4
    end
  end
  ki = ki + cnt
end
out[o + 1] = st
return out
