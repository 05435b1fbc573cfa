# Mints the tokens of sluice's JWT tests with an implementation other than
# the one sluice verifies with: keys made by jwcrypto, tokens signed by
# PyJWT (Debian's python3-jwcrypto and python3-jwt).
#
# stdin: {"secret": "...", "keys": [{"name", "type", "alg"?}],
#         "tokens": [{"name", "alg", "key", "kid"?, "header"?, "claims"? | "payload"?}]}
# stdout: {"jwk": {name: public JWK}, "pem": {name: public PEM}, "tokens": {name: token}}
import json
import sys

import jwt
from jwcrypto import jwk

req = json.load(sys.stdin)
out = {"jwk": {}, "pem": {}, "tokens": {}}
keys = {}
for k in req["keys"]:
    kind = k["type"]
    params = {"kid": k["name"]}
    if k.get("alg"):
        params["alg"] = k["alg"]
    if kind == "RSA":
        key = jwk.JWK.generate(kty="RSA", size=2048, **params)
    elif kind.startswith("EC:"):
        key = jwk.JWK.generate(kty="EC", crv=kind[3:], **params)
    elif kind == "Ed25519":
        key = jwk.JWK.generate(kty="OKP", crv="Ed25519", **params)
    else:
        raise SystemExit("unknown key type " + kind)
    keys[k["name"]] = key
    public = json.loads(key.export_public())
    public["use"] = "sig"
    out["jwk"][k["name"]] = public
    out["pem"][k["name"]] = key.export_to_pem(private_key=False).decode()

secret = req["secret"].encode()
for t in req["tokens"]:
    if t["key"] == "secret":
        signing = secret
    else:
        signing = keys[t["key"]].export_to_pem(private_key=True, password=None)
    headers = dict(t.get("header") or {})
    kid = t.get("kid", t["key"] if t["key"] != "secret" else "")
    if kid:
        headers["kid"] = kid
    if "payload" in t:
        token = jwt.api_jws.PyJWS().encode(t["payload"].encode(), signing, algorithm=t["alg"], headers=headers)
    else:
        token = jwt.encode(t["claims"], signing, algorithm=t["alg"], headers=headers)
    out["tokens"][t["name"]] = token if isinstance(token, str) else token.decode()

json.dump(out, sys.stdout)
