end
if tb_d and not tail then return tb_d end
return {ok, remaining, reset, retry, tail}
