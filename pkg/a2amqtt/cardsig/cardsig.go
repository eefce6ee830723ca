// Package cardsig signs and verifies A2A agent cards (A2A v1.0 §8.4): the card without its
// `signatures` member and without members that hold a default value, canonicalised with JCS
// (RFC 8785), signed as a detached JWS (RFC 7515) whose protected header carries alg, typ
// "JOSE", kid and jku; verified against a JWK Set that may hold several keys (a rotation's
// overlap). It does no I/O: the operator signs with it, the SDK and a2actl verify with it.
package cardsig

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"
	jose "github.com/go-jose/go-jose/v4"
	"github.com/gowebpki/jcs"
)

// The verification outcomes a caller tells apart with errors.Is.
var (
	// ErrUnsigned: the card carries no signature at all.
	ErrUnsigned = errors.New("agent card is not signed")
	// ErrUntrustedKey: the card is signed, but by no key of the trusted set (a wrong key, or a
	// key the verifier has not learnt yet).
	ErrUntrustedKey = errors.New("agent card is not signed by a trusted key")
	// ErrInvalidSignature: a signature by a trusted key does not match the card (the card was
	// changed after signing) or is malformed.
	ErrInvalidSignature = errors.New("agent card signature is invalid")
)

// SignatureAlgorithms are the JWS algorithms cards are signed and verified with.
var SignatureAlgorithms = []jose.SignatureAlgorithm{jose.ES256, jose.EdDSA}

// headerTyp is the protected header's typ (A2A v1.0 §8.4.2).
const headerTyp = "JOSE"

// Key is one signing key: an ECDSA P-256 (ES256) or Ed25519 (EdDSA) private key and its key ID,
// the RFC 7638 thumbprint of its public key (so the same key always has the same kid, whoever
// loads it).
type Key struct {
	ID      string
	Private crypto.Signer
}

// NewKey generates an ECDSA P-256 key (ES256: what every JOSE library verifies).
func NewKey() (*Key, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate card signing key: %w", err)
	}
	return newKey(priv)
}

// ParseKeyPEM reads a private key in PEM (PKCS #8, or SEC 1 "EC PRIVATE KEY", as cert-manager
// and openssl write them).
func ParseKeyPEM(data []byte) (*Key, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("card signing key: no PEM block")
	}
	var priv any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		priv, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		priv, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("card signing key: %w", err)
	}
	signer, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("card signing key: unsupported key type %T", priv)
	}
	return newKey(signer)
}

func newKey(priv crypto.Signer) (*Key, error) {
	if _, err := algorithmOf(priv.Public()); err != nil {
		return nil, err
	}
	jwk := jose.JSONWebKey{Key: priv.Public()}
	sum, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("card signing key thumbprint: %w", err)
	}
	return &Key{ID: base64.RawURLEncoding.EncodeToString(sum), Private: priv}, nil
}

// PEM encodes the private key as PKCS #8.
func (k *Key) PEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k.Private)
	if err != nil {
		return nil, fmt.Errorf("encode card signing key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Algorithm is the key's JWS algorithm.
func (k *Key) Algorithm() jose.SignatureAlgorithm {
	alg, _ := algorithmOf(k.Private.Public())
	return alg
}

// PublicJWK is the key's public half as a JWK (kid, alg, use "sig").
func (k *Key) PublicJWK() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.Private.Public(), KeyID: k.ID, Algorithm: string(k.Algorithm()), Use: "sig"}
}

func algorithmOf(pub crypto.PublicKey) (jose.SignatureAlgorithm, error) {
	switch p := pub.(type) {
	case *ecdsa.PublicKey:
		if p.Curve != elliptic.P256() {
			return "", fmt.Errorf("card signing key: ECDSA curve %s, want P-256 (ES256)", p.Curve.Params().Name)
		}
		return jose.ES256, nil
	case ed25519.PublicKey:
		return jose.EdDSA, nil
	}
	return "", fmt.Errorf("card signing key: unsupported key type %T (want ECDSA P-256 or Ed25519)", pub)
}

// KeySet is the public JWK Set of keys, in their order.
func KeySet(keys ...*Key) jose.JSONWebKeySet {
	set := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(keys))}
	for _, k := range keys {
		set.Keys = append(set.Keys, k.PublicJWK())
	}
	return set
}

// ParseKeySet reads a JWK Set (RFC 7517 §5), or a single JWK (a pinned key). Private keys are
// reduced to their public half; keys without a kid are refused (signatures name their key).
func ParseKeySet(data []byte) (*jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil || set.Keys == nil {
		var one jose.JSONWebKey
		if err1 := json.Unmarshal(data, &one); err1 != nil {
			if err == nil {
				err = err1
			}
			return nil, fmt.Errorf("card keys: neither a JWK Set nor a JWK: %w", err)
		}
		set.Keys = []jose.JSONWebKey{one}
	}
	for i, k := range set.Keys {
		if k.KeyID == "" {
			return nil, fmt.Errorf("card keys: key %d has no kid", i)
		}
		if !k.IsPublic() {
			set.Keys[i] = k.Public()
		}
		if !set.Keys[i].Valid() {
			return nil, fmt.Errorf("card keys: key %q is not a valid public key", k.KeyID)
		}
	}
	return &set, nil
}

// Canonical is the form a card's signatures cover (A2A v1.0 §8.4.1): the card's JSON without
// its top-level `signatures` member and, at every depth, without members whose value is a
// default (null, false, 0, "", [] or {} once emptied), in JCS (RFC 8785). Two serialisations of
// the same card (fields in another order, required-but-empty lists written or left out, other
// number or string escapes) have the same canonical form.
func Canonical(card []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(card))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("agent card is not JSON: %w", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("agent card is not a JSON object")
	}
	delete(obj, "signatures")
	stripped, _ := withoutDefaults(obj)
	if stripped == nil {
		stripped = map[string]any{}
	}
	b, err := json.Marshal(stripped)
	if err != nil {
		return nil, fmt.Errorf("agent card: %w", err)
	}
	out, err := jcs.Transform(b)
	if err != nil {
		return nil, fmt.Errorf("agent card canonical form: %w", err)
	}
	return out, nil
}

// withoutDefaults drops default-valued object members recursively; ok is false when v itself
// is a default value. Array elements are kept (their position carries meaning).
func withoutDefaults(v any) (out any, ok bool) {
	switch x := v.(type) {
	case nil:
		return nil, false
	case bool:
		return x, x
	case string:
		return x, x != ""
	case json.Number:
		f, err := x.Float64()
		return x, err != nil || f != 0
	case []any:
		for i, e := range x {
			if o, ok := e.(map[string]any); ok {
				s, _ := withoutDefaults(o)
				if s == nil {
					s = map[string]any{}
				}
				x[i] = s
			}
		}
		return x, len(x) > 0
	case map[string]any:
		for k, e := range x {
			s, keep := withoutDefaults(e)
			if !keep {
				delete(x, k)
				continue
			}
			x[k] = s
		}
		if len(x) == 0 {
			return nil, false
		}
		return x, true
	}
	return v, true
}

// Sign returns the card's JSON with its `signatures` replaced by one detached JWS per key (ES256
// or EdDSA by key type), each with the protected header {alg, typ "JOSE", kid, jku}. jku is
// where the keys' JWK Set is published ("" leaves it out).
func Sign(card []byte, jku string, keys ...*Key) ([]byte, error) {
	if len(keys) == 0 {
		return nil, errors.New("sign agent card: no key")
	}
	canonical, err := Canonical(card)
	if err != nil {
		return nil, fmt.Errorf("sign agent card: %w", err)
	}
	sigs, err := signatures(canonical, jku, keys)
	if err != nil {
		return nil, err
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(card, &members); err != nil {
		return nil, fmt.Errorf("sign agent card: %w", err)
	}
	raw, err := json.Marshal(sigs)
	if err != nil {
		return nil, fmt.Errorf("sign agent card: %w", err)
	}
	members["signatures"] = raw
	out, err := json.Marshal(members)
	if err != nil {
		return nil, fmt.Errorf("sign agent card: %w", err)
	}
	return out, nil
}

// SignCard sets card.Signatures: one signature per key over the card as a2a-go encodes it.
func SignCard(card *a2a.AgentCard, jku string, keys ...*Key) error {
	unsigned := *card
	unsigned.Signatures = nil
	b, err := json.Marshal(&unsigned)
	if err != nil {
		return fmt.Errorf("sign agent card: %w", err)
	}
	canonical, err := Canonical(b)
	if err != nil {
		return fmt.Errorf("sign agent card: %w", err)
	}
	sigs, err := signatures(canonical, jku, keys)
	if err != nil {
		return err
	}
	card.Signatures = sigs
	return nil
}

func signatures(canonical []byte, jku string, keys []*Key) ([]a2a.AgentCardSignature, error) {
	out := make([]a2a.AgentCardSignature, 0, len(keys))
	for _, k := range keys {
		opts := (&jose.SignerOptions{}).WithType(headerTyp)
		if jku != "" {
			opts = opts.WithHeader("jku", jku)
		}
		signer, err := jose.NewSigner(jose.SigningKey{
			Algorithm: k.Algorithm(),
			Key:       jose.JSONWebKey{Key: k.Private, KeyID: k.ID},
		}, opts)
		if err != nil {
			return nil, fmt.Errorf("sign agent card with key %s: %w", k.ID, err)
		}
		jws, err := signer.Sign(canonical)
		if err != nil {
			return nil, fmt.Errorf("sign agent card with key %s: %w", k.ID, err)
		}
		compact, err := jws.DetachedCompactSerialize()
		if err != nil {
			return nil, fmt.Errorf("sign agent card with key %s: %w", k.ID, err)
		}
		protected, signature, _ := strings.Cut(strings.Replace(compact, "..", ".", 1), ".")
		out = append(out, a2a.AgentCardSignature{Protected: protected, Signature: signature})
	}
	return out, nil
}

// Verified says which trusted key vouched for a card.
type Verified struct {
	KeyID     string
	Algorithm string
	// JKU is the protected header's jku: where the signer says its keys are published (only
	// information: the trusted set, not the card, decides which keys count).
	JKU string
}

// Verify checks card (its JSON as received) against the trusted keys: it is verified when a
// signature by one of them matches its canonical form. Signatures by keys outside the set are
// skipped (a rotation adds a signature by a key an older set does not know). The error wraps
// ErrUnsigned, ErrUntrustedKey or ErrInvalidSignature.
func Verify(card []byte, trusted *jose.JSONWebKeySet) (Verified, error) {
	var body struct {
		Signatures []a2a.AgentCardSignature `json:"signatures"`
	}
	if err := json.Unmarshal(card, &body); err != nil {
		return Verified{}, fmt.Errorf("%w: %w", ErrInvalidSignature, err)
	}
	if len(body.Signatures) == 0 {
		return Verified{}, ErrUnsigned
	}
	canonical, err := Canonical(card)
	if err != nil {
		return Verified{}, fmt.Errorf("%w: %w", ErrInvalidSignature, err)
	}
	var failures []string
	var kids []string
	for i, sig := range body.Signatures {
		jws, err := jose.ParseDetached(sig.Protected+".."+sig.Signature, canonical, SignatureAlgorithms)
		if err != nil {
			failures = append(failures, fmt.Sprintf("signature %d: %v", i, err))
			continue
		}
		h := jws.Signatures[0].Protected
		kids = append(kids, h.KeyID)
		if h.KeyID == "" || trusted == nil {
			continue
		}
		for _, key := range trusted.Key(h.KeyID) {
			if key.Algorithm != "" && key.Algorithm != h.Algorithm {
				failures = append(failures, fmt.Sprintf("signature %d: alg %s, key %s is for %s", i, h.Algorithm, h.KeyID, key.Algorithm))
				continue
			}
			if err := jws.DetachedVerify(canonical, key.Key); err != nil {
				failures = append(failures, fmt.Sprintf("signature %d by key %s: %v", i, h.KeyID, err))
				continue
			}
			jku, _ := h.ExtraHeaders["jku"].(string)
			return Verified{KeyID: h.KeyID, Algorithm: h.Algorithm, JKU: jku}, nil
		}
	}
	if len(failures) > 0 {
		return Verified{}, fmt.Errorf("%w: %s", ErrInvalidSignature, strings.Join(failures, "; "))
	}
	slices.Sort(kids)
	return Verified{}, fmt.Errorf("%w: signed by %s", ErrUntrustedKey, strings.Join(slices.Compact(kids), ", "))
}
