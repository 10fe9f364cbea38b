# A client that sends exactly N keep-alive POSTs of the 2 KiB chat body of scenario a
# (load-tests/instructions.sh): `fixed_client.py PORT N [stream]` prints how many answered 200
# (`stream`: the same body with "stream":true, load-tests/syscalls.sh).
import http.client, sys, json
port=int(sys.argv[1]); n=int(sys.argv[2])
stream="true" if len(sys.argv)>3 and sys.argv[3]=="stream" else "false"
head='{"model":"lt","stream":'+stream+',"max_tokens":64,"messages":[{"role":"system","content":"You are a load test."},{"role":"user","content":"'
tail='"}]}'
pad=2048-len(head)-len(tail)
word="lorem ipsum dolor sit amet "
body=(head+(word*(pad//len(word)+1))[:pad]+tail).encode()
c=http.client.HTTPConnection("127.0.0.1",port)
ok=0
for i in range(n):
    c.request("POST","/v1/chat/completions",body,{"Content-Type":"application/json","Authorization":"Bearer sk-load-test"})
    r=c.getresponse(); b=r.read()
    if r.status==200: ok+=1
print(ok)
