package cardsig_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

const jku = "mqtt://broker:1883/$a2a-fleet/v1/card-keys"

func testCard() *a2a.AgentCard {
	return &a2a.AgentCard{
		Name: "echo", Description: "Echoes — with “quotes” & <html>", Version: "1.0.0",
		DefaultInputModes: []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"},
		Capabilities: a2a.AgentCapabilities{Streaming: true, Extensions: []a2a.AgentExtension{
			{URI: "urn:x", Params: map[string]any{"n": 1.5, "list": []any{1, "two"}}}}},
		SupportedInterfaces: []*a2a.AgentInterface{a2a.NewAgentInterface("mqtt://b/$a2a/v1/request/acme/sales/echo", "MQTT")},
		Skills:              []a2a.AgentSkill{{ID: "echo", Name: "Echo", Description: "says it back", Tags: []string{"echo"}}},
	}
}

func mustKey(t *testing.T) *cardsig.Key {
	t.Helper()
	k, err := cardsig.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func set(keys ...*cardsig.Key) *jose.JSONWebKeySet {
	s := cardsig.KeySet(keys...)
	return &s
}

func signed(t *testing.T, keys ...*cardsig.Key) []byte {
	t.Helper()
	raw, err := json.Marshal(testCard())
	if err != nil {
		t.Fatal(err)
	}
	out, err := cardsig.Sign(raw, jku, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// reserialise rewrites a card's JSON in another form: members in reverse order, indented,
// every string's ASCII letters escaped as \u00XX, default-valued members spelled out.
func reserialise(t *testing.T, card []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(card, &m); err != nil {
		t.Fatal(err)
	}
	m["iconUrl"] = json.RawMessage(`""`)
	m["securitySchemes"] = json.RawMessage(`{}`)
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	// reverse lexical order
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] > keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	var b strings.Builder
	b.WriteString("{\n")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",\n")
		}
		b.WriteString("  \"" + k + "\" :  ")
		v := string(m[k])
		if k == "name" {
			v = `"\u0065\u0063\u0068\u006f"` // "echo"
		}
		b.WriteString(v)
	}
	b.WriteString("\n}")
	return []byte(b.String())
}

func TestSignVerify(t *testing.T) {
	k1, k2, k3 := mustKey(t), mustKey(t), mustKey(t)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	_ = edPub
	der, _ := x509.MarshalPKCS8PrivateKey(edPriv)
	ed, err := cardsig.ParseKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	card := signed(t, k1)
	// The same card through a2a-go's types (as an SDK client decodes and re-encodes it).
	var decoded a2a.AgentCard
	if err := json.Unmarshal(card, &decoded); err != nil {
		t.Fatal(err)
	}
	roundTrip, _ := json.Marshal(&decoded)
	// Signed with a required list empty ([]), read back by a client that left it nil (null).
	c2 := testCard()
	c2.DefaultInputModes = []string{}
	if err := cardsig.SignCard(c2, jku, k1); err != nil {
		t.Fatal(err)
	}
	c2.DefaultInputModes = nil
	viaStruct, _ := json.Marshal(c2)
	if !strings.Contains(string(viaStruct), `"defaultInputModes":null`) {
		t.Fatalf("want null in %s", viaStruct)
	}
	mutatedOther := strings.Replace(string(card), `"echo"`, `"echO"`, 1)

	for _, tc := range []struct {
		name    string
		card    []byte
		trusted *jose.JSONWebKeySet
		want    error
		wantKid string
	}{
		{"signed, verified", card, set(k1), nil, k1.ID},
		{"reordered and re-serialised", reserialise(t, card), set(k1), nil, k1.ID},
		{"through a2a-go types", roundTrip, set(k1), nil, k1.ID},
		{"nil list vs empty list", viaStruct, set(k1), nil, k1.ID},
		{"wrong key", card, set(k2), cardsig.ErrUntrustedKey, ""},
		{"no trusted keys", card, set(), cardsig.ErrUntrustedKey, ""},
		{"unsigned", mustJSON(t, testCard()), set(k1), cardsig.ErrUnsigned, ""},
		{"tampered", []byte(mutatedOther), set(k1), cardsig.ErrInvalidSignature, ""},
		{"overlap: both signatures, old set", signed(t, k1, k2), set(k1), nil, k1.ID},
		{"overlap: both signatures, new set", signed(t, k1, k2), set(k2), nil, k2.ID},
		{"overlap: both signatures, third key", signed(t, k1, k2), set(k3), cardsig.ErrUntrustedKey, ""},
		{"EdDSA", signed(t, ed), set(ed), nil, ed.ID},
		{"EdDSA beside ES256, ES256 set", signed(t, ed, k2), set(k2), nil, k2.ID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := cardsig.Verify(tc.card, tc.trusted)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if v.KeyID != tc.wantKid || v.JKU != jku {
					t.Fatalf("verified by %+v, want kid %s jku %s", v, tc.wantKid, jku)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

// An attacker who re-signs a changed card with its own key under the trusted key's kid gets an
// invalid signature, not a verified card.
func TestForgedKidFails(t *testing.T) {
	k1 := mustKey(t)
	attacker := mustKey(t)
	attacker.ID = k1.ID
	_, err := cardsig.Verify(signed(t, attacker), set(k1))
	if !errors.Is(err, cardsig.ErrInvalidSignature) {
		t.Fatalf("Verify = %v, want ErrInvalidSignature", err)
	}
}

// A member whose value is a default is not covered (§8.4.1: it is the same card as one without
// the member), so its name can change; its value cannot.
func TestDefaultValuedMembersAreNotCovered(t *testing.T) {
	k := mustKey(t)
	card := strings.Replace(string(signed(t, k)), `"n":1.5`, `"n":1.5,"zero":0,"empty":[]`, 1)
	if _, err := cardsig.Verify([]byte(card), set(k)); err != nil {
		t.Fatalf("default-valued members added: %v", err)
	}
	renamed := strings.Replace(card, `"zero":0`, `"zerp":0`, 1)
	if _, err := cardsig.Verify([]byte(renamed), set(k)); err != nil {
		t.Fatalf("default-valued member renamed: %v", err)
	}
	changed := strings.Replace(card, `"zero":0`, `"zero":1`, 1)
	if _, err := cardsig.Verify([]byte(changed), set(k)); !errors.Is(err, cardsig.ErrInvalidSignature) {
		t.Fatalf("a default value changed: %v", err)
	}
}

// Every one-character change of the card outside its signatures fails, and so does a change
// inside a signature or its protected header.
func TestOneCharacterChangeAnywhereFails(t *testing.T) {
	k := mustKey(t)
	card := signed(t, k)
	sigStart := strings.Index(string(card), `"signatures":`)
	sigEnd := sigStart + strings.Index(string(card[sigStart:]), "]") + 1
	var protectedAt, signatureAt int
	{
		var c a2a.AgentCard
		_ = json.Unmarshal(card, &c)
		protectedAt = strings.Index(string(card), c.Signatures[0].Protected) + 10
		signatureAt = strings.Index(string(card), c.Signatures[0].Signature) + 10
	}
	checked := 0
	for i := range card {
		if i >= sigStart && i < sigEnd && i != protectedAt && i != signatureAt {
			continue
		}
		mutated := append([]byte(nil), card...)
		mutated[i] = other(card[i])
		if _, err := cardsig.Verify(mutated, set(k)); err == nil {
			t.Errorf("changing byte %d (%q→%q) still verifies: %s", i, card[i], mutated[i], mutated)
		}
		checked++
	}
	if checked < 300 {
		t.Fatalf("only %d positions checked", checked)
	}
}

func other(c byte) byte {
	switch {
	case c >= 'a' && c < 'z', c >= 'A' && c < 'Z', c >= '0' && c < '9':
		return c + 1
	case c == 'z':
		return 'a'
	case c == 'Z':
		return 'A'
	case c == '9':
		return '0'
	}
	return 'x'
}

// The protected header names what §8.4.2 asks for, and the kid is the key's RFC 7638 thumbprint.
func TestProtectedHeader(t *testing.T) {
	k := mustKey(t)
	var c a2a.AgentCard
	if err := json.Unmarshal(signed(t, k), &c); err != nil {
		t.Fatal(err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(c.Signatures[0].Protected)
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	if h["alg"] != "ES256" || h["typ"] != "JOSE" || h["kid"] != k.ID || h["jku"] != jku {
		t.Fatalf("protected header %v", h)
	}
	jwk := k.PublicJWK()
	if !jwk.IsPublic() || jwk.Algorithm != "ES256" || jwk.Use != "sig" {
		t.Fatalf("public JWK %+v", jwk)
	}
}

func TestKeys(t *testing.T) {
	k := mustKey(t)
	p, err := k.PEM()
	if err != nil {
		t.Fatal(err)
	}
	again, err := cardsig.ParseKeyPEM(p)
	if err != nil || again.ID != k.ID {
		t.Fatalf("PEM round trip: %v, kid %s vs %s", err, again.ID, k.ID)
	}
	// SEC 1, as openssl ecparam writes it.
	ec := k.Private.(*ecdsa.PrivateKey)
	der, _ := x509.MarshalECPrivateKey(ec)
	sec1, err := cardsig.ParseKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	if err != nil || sec1.ID != k.ID {
		t.Fatalf("SEC 1: %v", err)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der, _ = x509.MarshalPKCS8PrivateKey(p384)
	if _, err := cardsig.ParseKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err == nil {
		t.Fatal("a P-384 key was accepted for ES256")
	}

	// A JWK Set, a single (pinned) JWK, and a private JWK reduced to its public half.
	js, _ := json.Marshal(cardsig.KeySet(k))
	one, _ := json.Marshal(k.PublicJWK())
	private, _ := json.Marshal(jose.JSONWebKey{Key: k.Private, KeyID: k.ID, Algorithm: "ES256"})
	card := signed(t, k)
	for name, data := range map[string][]byte{"set": js, "one": one, "private": private} {
		s, err := cardsig.ParseKeySet(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !s.Keys[0].IsPublic() {
			t.Fatalf("%s: kept a private key", name)
		}
		if _, err := cardsig.Verify(card, s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := cardsig.ParseKeySet([]byte(`{"keys":[{"kty":"EC","crv":"P-256","x":"` + "AA" + `"}]}`)); err == nil {
		t.Fatal("a key without kid was accepted")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkSign is the operator's cost per published card and key (canonical form and one ES256
// signature).
func BenchmarkSign(b *testing.B) {
	k, err := cardsig.NewKey()
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal(testCard())
	for b.Loop() {
		if _, err := cardsig.Sign(raw, jku, k); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify is a client's cost per card.
func BenchmarkVerify(b *testing.B) {
	k, _ := cardsig.NewKey()
	raw, _ := json.Marshal(testCard())
	card, _ := cardsig.Sign(raw, jku, k)
	keys := cardsig.KeySet(k)
	for b.Loop() {
		if _, err := cardsig.Verify(card, &keys); err != nil {
			b.Fatal(err)
		}
	}
}
