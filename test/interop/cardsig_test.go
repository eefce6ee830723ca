package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// jsCardsig runs js/cardsig.mjs (npm jose + canonicalize) with req on stdin.
func jsCardsig(t *testing.T, glue, mode string, req any) map[string]any {
	t.Helper()
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(glue, "cardsig.mjs"), mode)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node cardsig.mjs %s: %v\n%s", mode, err, stderr.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node cardsig.mjs %s: %v: %s", mode, err, out)
	}
	return res
}

// reserialised is the card as another JSON library might write it: indented, members in reverse
// order, no HTML escaping, required-but-empty members written out.
func reserialised(t *testing.T, card []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(card, &m); err != nil {
		t.Fatal(err)
	}
	m["iconUrl"] = ""
	m["securitySchemes"] = map[string]any{}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	var buf bytes.Buffer
	buf.WriteString("{\n")
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("  ", "  ")
		fmt.Fprintf(&buf, "  %q: ", k)
		if err := enc.Encode(m[k]); err != nil {
			t.Fatal(err)
		}
		buf.Truncate(buf.Len() - 1)
		if i > 0 {
			buf.WriteString(",")
		}
		buf.WriteString("\n")
	}
	buf.WriteString("}")
	return buf.Bytes()
}

// A card the operator signed (read from the broker as published, with its retained key set)
// verifies with npm jose after JCS by npm canonicalize, also re-serialised; a one-character
// change fails there too. A card signed by npm jose verifies in Go (cardsig and the SDK's
// CardTrust). On the embedded broker and on Mosquitto with dynsec: the card npm jose checks is
// the one each broker retained and delivered.
func TestCardSignaturesInterop(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) { cardSignaturesInterop(t, kind) })
	}
}

func cardSignaturesInterop(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := testenv.StartBroker(t, ctx, kind)
	ns := cp.NewNamespace(t, ctx, "cardsig-")
	cp.BindNamespace(t, ctx, ns, org)
	cp.StartOperatorWith(t, ctx, testenv.Operator{Namespaces: map[string]string{org: ns}, Broker: registration.BrokerConfig{
		URL: b.URL, Backend: b.Backend,
		CardSigning: &registration.CardSigning{Secret: client.ObjectKey{Namespace: ns, Name: "card-keys"}, Generate: true, Reader: k8s},
	}})
	apply(t, ctx, ns, `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: ledger}
spec:
  orgID: acme
  unitID: sales
  card:
    name: ledger
    description: "Überprüft <Rechnungen> & “Belege” — 💶 \\ \"quoted\" \t tab"
    version: "2.0.1"
    provider: {organization: ACME, url: "https://acme.example/a?b=1&c=2"}
    capabilities: {streaming: true, extensions: [{uri: "urn:x-ext", description: "ext", required: false}]}
    defaultInputModes: [text/plain, application/json]
    skills:
    - {id: audit, name: Audit, description: "checks books", tags: [finance, "übung"], examples: ["audit Q3", "ünïcödé"]}
    - {id: empty, name: Empty, description: "no tags"}
`)
	agent := &a2av1.Agent{}
	var password string
	testenv.Eventually(t, 60*time.Second, "agent registered with a published card", func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ledger"}, agent); err != nil {
			return err
		}
		if agent.Status.PublishedCardDigest == "" || agent.Status.CredentialsSecret == "" {
			return errors.New("not yet")
		}
		sec := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: agent.Status.CredentialsSecret}, sec); err != nil {
			return err
		}
		password = string(sec.Data[identity.SecretKeyPassword])
		return nil
	})
	id := identity.Of(agent)
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.URL, Username: identity.Username(id), Password: password, Agent: id})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	retained := func(topic string) []byte {
		got := make(chan []byte, 1)
		sub, err := conn.Subscribe(ctx, topic, func(p *paho.Publish) {
			select {
			case got <- p.Payload:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Close(ctx) }()
		select {
		case p := <-got:
			return p
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing retained on %s", topic)
		}
		return nil
	}
	var card []byte
	testenv.Eventually(t, 30*time.Second, "the signed card on the broker", func() error {
		card = retained(id.DiscoveryTopic())
		if !bytes.Contains(card, []byte(`"signatures"`)) {
			return fmt.Errorf("unsigned: %s", card)
		}
		return nil
	})
	var jwks map[string]any
	if err := json.Unmarshal(retained(a2amqtt.CardKeysTopic), &jwks); err != nil {
		t.Fatal(err)
	}
	glue := glueDir(t)

	// Operator → npm jose.
	tampered := bytes.Replace(card, []byte("Audit"), []byte("Audis"), 1)
	for _, tc := range []struct {
		name string
		card []byte
		want bool
	}{
		{"as published", card, true},
		{"re-serialised", reserialised(t, card), true},
		{"one character changed", tampered, false},
	} {
		res := jsCardsig(t, glue, "verify", map[string]any{"card": string(tc.card), "jwks": jwks})
		if res["verified"] != tc.want {
			t.Fatalf("%s: npm jose says %v, want verified=%v", tc.name, res, tc.want)
		}
		if tc.want && res["jku"] != b.URL+"/"+a2amqtt.CardKeysTopic {
			t.Fatalf("%s: jku %v", tc.name, res["jku"])
		}
	}

	// npm jose → Go.
	unsigned, err := json.Marshal(registration.BuildCard(agent, id, "", b.URL))
	if err != nil {
		t.Fatal(err)
	}
	res := jsCardsig(t, glue, "sign", map[string]any{"card": string(unsigned), "jku": "https://keys.example/jwks.json"})
	jsCard := []byte(res["card"].(string))
	jsKeys, _ := json.Marshal(res["jwks"])
	set, err := cardsig.ParseKeySet(jsKeys)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := cardsig.Verify(jsCard, set); err != nil || v.JKU != "https://keys.example/jwks.json" {
		t.Fatalf("a card signed by npm jose: %v %+v", err, v)
	}
	if _, err := cardsig.Verify(reserialised(t, jsCard), set); err != nil {
		t.Fatalf("a card signed by npm jose, re-serialised: %v", err)
	}
	trust := a2amqtt.NewCardTrust(set)
	if sig := trust.Verify(jsCard); sig.State != a2amqtt.CardVerified {
		t.Fatalf("SDK: %+v", sig)
	}
	if sig := trust.Verify(bytes.Replace(jsCard, []byte("ledger"), []byte("ledgeR"), 1)); sig.State != a2amqtt.CardInvalid || !errors.Is(sig.Err, cardsig.ErrInvalidSignature) {
		t.Fatalf("SDK, tampered: %+v", sig)
	}
	// And the operator's own key set does not vouch for it.
	opKeys, _ := json.Marshal(jwks)
	opSet, _ := cardsig.ParseKeySet(opKeys)
	if sig := a2amqtt.NewCardTrust(opSet).Verify(jsCard); !errors.Is(sig.Err, cardsig.ErrUntrustedKey) {
		t.Fatalf("a foreign key verified with the operator's keys: %+v", sig)
	}
}
