// Independent check of signed agent cards (A2A v1.0 §8.4) for test/interop: npm "canonicalize"
// (JCS, RFC 8785) and npm "jose" (JWS, RFC 7515), nothing of the Go implementation.
//
//   node cardsig.mjs verify   stdin {"card": <card JSON text>, "jwks": <JWK Set>}
//                             stdout {"verified": true, "kid": …} or {"verified": false, "error": …}
//   node cardsig.mjs sign     stdin {"card": <card JSON text>, "jku": "…"}
//                             stdout {"card": <signed card JSON text>, "jwks": <JWK Set>}
import canonicalize from 'canonicalize';
import * as jose from 'jose';

// The signed form: the card without `signatures` and, at every depth, without members holding
// a default value (null, false, 0, "", [], {} once emptied), canonicalised with JCS.
function withoutDefaults(v) {
  if (v === null || v === false || v === 0 || v === '') return undefined;
  if (Array.isArray(v)) {
    const out = v.map((e) => (e !== null && typeof e === 'object' && !Array.isArray(e) ? (withoutDefaults(e) ?? {}) : e));
    return out.length ? out : undefined;
  }
  if (typeof v === 'object') {
    const out = {};
    for (const [k, e] of Object.entries(v)) {
      const s = withoutDefaults(e);
      if (s !== undefined) out[k] = s;
    }
    return Object.keys(out).length ? out : undefined;
  }
  return v;
}

function signedBytes(cardText) {
  const card = JSON.parse(cardText);
  delete card.signatures;
  return new TextEncoder().encode(canonicalize(withoutDefaults(card) ?? {}));
}

async function verify({ card, jwks }) {
  const payload = signedBytes(card);
  const keys = jose.createLocalJWKSet(jwks);
  const errors = [];
  for (const sig of JSON.parse(card).signatures ?? []) {
    try {
      const res = await jose.flattenedVerify(
        { protected: sig.protected, signature: sig.signature, payload: jose.base64url.encode(payload) },
        keys,
        { algorithms: ['ES256', 'EdDSA'] },
      );
      if (res.protectedHeader.typ !== 'JOSE' || !res.protectedHeader.jku) throw new Error(`header ${JSON.stringify(res.protectedHeader)}`);
      return { verified: true, kid: res.protectedHeader.kid, jku: res.protectedHeader.jku };
    } catch (e) {
      errors.push(String(e.code ?? e.message));
    }
  }
  return { verified: false, error: errors.length ? errors.join('; ') : 'unsigned' };
}

async function sign({ card, jku }) {
  const { publicKey, privateKey } = await jose.generateKeyPair('ES256', { extractable: true });
  const jwk = await jose.exportJWK(publicKey);
  jwk.kid = await jose.calculateJwkThumbprint(jwk);
  jwk.alg = 'ES256';
  jwk.use = 'sig';
  const jws = await new jose.FlattenedSign(signedBytes(card))
    .setProtectedHeader({ alg: 'ES256', typ: 'JOSE', kid: jwk.kid, jku })
    .sign(privateKey);
  const out = JSON.parse(card);
  out.signatures = [{ protected: jws.protected, signature: jws.signature }];
  return { card: JSON.stringify(out), jwks: { keys: [jwk] } };
}

let input = '';
for await (const chunk of process.stdin) input += chunk;
const req = JSON.parse(input);
const res = process.argv[2] === 'sign' ? await sign(req) : await verify(req);
process.stdout.write(JSON.stringify(res));
