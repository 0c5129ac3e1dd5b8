      else
        call('SET', KEYS[ki + i], wv, 'PX', mss[i])
      end
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = r[1], r[2], r[3], r[4]
    end
  end
  ki = ki + cnt
end
out[#out + 1] = st
return out
