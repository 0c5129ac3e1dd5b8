end
return {ok, remaining, reset, retry, tail}
