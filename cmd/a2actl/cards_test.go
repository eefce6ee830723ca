package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// `agents` shows each card's signature once there is a trust anchor (the retained key set, or
// --card-keys), and `card verify` checks one card: verified, unverified (unsigned), invalid
// (tampered, or signed by another key).
func TestCardSignatures(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		broker := "--broker=" + b.URL()
		key, _ := cardsig.NewKey()
		other, _ := cardsig.NewKey()
		pub := publishCards(t, b, key, other)

		// No key set on the broker: no signature column (the output cards had before).
		code, out, errOut := runCLI(t, "", "agents", broker, "--wait=1s")
		if code != exitOK || strings.Contains(out, "SIGNATURE") || !strings.Contains(out, "demo/u/good") {
			t.Fatalf("agents without keys: %d\n%s\n%s", code, out, errOut)
		}
		code, _, errOut = runCLI(t, "", "card", "verify", "demo/u/good", broker)
		if code != exitFailure || !strings.Contains(errOut, "no trust anchor") {
			t.Fatalf("card verify without keys: %d %s", code, errOut)
		}

		// The key set retained, as the operator keeps it.
		keys, _ := json.Marshal(cardsig.KeySet(key))
		if pr, err := pub.PublishWith(&paho.Publish{Topic: a2amqtt.CardKeysTopic, QoS: 1, Retain: true, Payload: keys}); err != nil || pr.ReasonCode >= 0x80 {
			t.Fatalf("publish keys: %v %v", pr, err)
		}
		checkSignatureColumn(t, broker)
		checkCardVerify(t, broker, key, other)
		checkPinnedKey(t, broker, other)
	})
}

// publishCards retains four cards under demo/u: good (signed by key), bad (signed, then
// tampered with), plain (unsigned) and stranger (signed by other). It returns the publisher.
func publishCards(t *testing.T, b brokertest.Broker, key, other *cardsig.Key) *brokertest.Client {
	t.Helper()
	card := func(name string) []byte {
		raw, _ := json.Marshal(&a2a.AgentCard{Name: name, Description: name + " agent", Version: "1",
			SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(b.URL(), a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: name})},
			DefaultInputModes:   []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"}, Skills: []a2a.AgentSkill{}})
		return raw
	}
	sign := func(raw []byte, k *cardsig.Key) []byte {
		out, err := cardsig.Sign(raw, "", k)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	tampered := strings.Replace(string(sign(card("bad"), key)), `"bad agent"`, `"bad agenT"`, 1)
	pub := brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: "publisher", IgnoreMessages: true})
	for topic, payload := range map[string][]byte{
		a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "good"}.DiscoveryTopic():     sign(card("good"), key),
		a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "bad"}.DiscoveryTopic():      []byte(tampered),
		a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "plain"}.DiscoveryTopic():    card("plain"),
		a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "stranger"}.DiscoveryTopic(): sign(card("stranger"), other),
	} {
		if pr, err := pub.PublishWith(&paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: payload}); err != nil || pr.ReasonCode >= 0x80 {
			t.Fatalf("publish %s: %v %v", topic, pr, err)
		}
	}
	return pub
}

// checkSignatureColumn: with the key set retained, agents shows each card's signature.
func checkSignatureColumn(t *testing.T, broker string) {
	t.Helper()
	code, out, errOut := runCLI(t, "", "agents", broker, "--wait=1s")
	want := map[string]string{"demo/u/good": "verified", "demo/u/bad": "invalid", "demo/u/plain": "unverified", "demo/u/stranger": "invalid"}
	if code != exitOK || !strings.Contains(out, "SIGNATURE") {
		t.Fatalf("agents: %d\n%s\n%s", code, out, errOut)
	}
	for _, line := range strings.Split(out, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if !slices.Contains(f, want[f[0]]) {
			t.Errorf("%s: want signature %q\n%s", f[0], want[f[0]], out)
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Fatalf("agents missing %v\n%s", want, out)
	}
	code, out, _ = runCLI(t, "", "agents", broker, "--wait=1s", "--json")
	var rows []map[string]any
	if code != exitOK || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 4 || rows[0]["agent"] != "demo/u/bad" || rows[0]["signature"] != "invalid" {
		t.Fatalf("agents --json: %d %s", code, out)
	}
}

// checkCardVerify: card verify checks one card against the retained key set.
func checkCardVerify(t *testing.T, broker string, key, other *cardsig.Key) {
	t.Helper()

	for agent, wantOut := range map[string]string{
		"demo/u/good":     "verified (key " + key.ID + ")",
		"demo/u/bad":      "invalid: agent card on $a2a/v1/discovery/demo/u/bad refused: agent card not verified: agent card signature is invalid",
		"demo/u/plain":    "unverified: agent card on $a2a/v1/discovery/demo/u/plain refused: agent card not verified: agent card is not signed",
		"demo/u/stranger": "invalid: agent card on $a2a/v1/discovery/demo/u/stranger refused: agent card not verified: agent card is not signed by a trusted key: signed by " + other.ID,
	} {
		code, out, errOut := runCLI(t, "", "card", "verify", agent, broker)
		wantCode := exitFailure
		if agent == "demo/u/good" {
			wantCode = exitOK
		}
		if code != wantCode || !strings.Contains(out, wantOut) {
			t.Errorf("card verify %s: %d\n%s\n%s\nwant %q", agent, code, out, errOut, wantOut)
		}
	}
	code, _, errOut := runCLI(t, "", "card", "verify", "demo/u/nobody", broker, "--presence-wait=300ms")
	if code != exitOffline {
		t.Fatalf("card verify of no card: %d %s", code, errOut)
	}
}

// checkPinnedKey: a pinned key from a file replaces the retained set.
func checkPinnedKey(t *testing.T, broker string, other *cardsig.Key) {
	t.Helper()

	// A pinned key from a file replaces the retained set: then the good card is the stranger.
	pinned := filepath.Join(t.TempDir(), "pinned.jwk")
	one, _ := json.Marshal(other.PublicJWK())
	if err := os.WriteFile(pinned, one, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCLI(t, "", "card", "verify", "demo/u/stranger", broker, "--card-keys="+pinned); code != exitOK {
		t.Fatalf("pinned key: %d %s", code, out)
	}
	if code, out, _ := runCLI(t, "", "card", "verify", "demo/u/good", broker, "--card-keys="+pinned); code != exitFailure || !strings.Contains(out, "invalid") {
		t.Fatalf("pinned key, other card: %d %s", code, out)
	}
	// send with --card-keys refuses an agent whose card does not verify, before it asks.
	if code, _, errOut := runCLI(t, "", "send", "demo/u/good", "hi", broker, "--card-keys="+pinned); code != exitFailure || !strings.Contains(errOut, "agent card not verified") {
		t.Fatalf("send to an agent whose card does not verify: %d %s", code, errOut)
	}
}
