package conformance_test

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

const (
	noMatchingSubscribers = 0x10
	requestTopic          = "$a2a/v1/request/acme/u/agent"
)

// A QoS 1 publish that no subscription matches gets PUBACK 0x10 "no
// matching subscribers" on both brokers (mochi never says it by itself; the
// embedded broker's hook does), a matched one 0x00, and a retained one
// without subscribers is still retained. Requesters rely on 0x10 to fail
// fast when an agent is offline (-32004) instead of timing out.
func TestNoMatchingSubscribers(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b *broker) {
		d := fleet()
		grant(d, roleCaller, allow(acl.PublishClientSend, "$a2a/v1/discovery/acme/#", 0))
		grant(d, roleAgent, allow(acl.SubscribePattern, "$a2a/v1/discovery/acme/#", 0))
		apply(t, b, d)
		caller := mustDial(t, b, userCaller, pwCaller, "acme/u/caller")

		if code := caller.pub(requestTopic, "nobody listens"); code != noMatchingSubscribers {
			t.Errorf("%s: publish without subscribers: PUBACK %#x, want 0x10", b.name, code)
		}
		pr, err := caller.PublishWith(&paho.Publish{Topic: "$a2a/v1/discovery/acme/u/caller", QoS: 1, Retain: true, Payload: []byte("card")})
		if err != nil && pr == nil {
			t.Fatalf("%s: retained publish: %v", b.name, err)
		}
		if pr.ReasonCode != noMatchingSubscribers {
			t.Errorf("%s: retained publish without subscribers: PUBACK %#x, want 0x10 (Mosquitto's answer)", b.name, pr.ReasonCode)
		}
		// A refused publish is still 0x87, not 0x10.
		if code := caller.pub("$a2a/v1/request/other/agent", "x"); code != notAuthorized {
			t.Errorf("%s: forbidden publish: PUBACK %#x, want 0x87", b.name, code)
		}

		agent := mustDial(t, b, userAgent, pwAgent, "acme/u/agent")
		if code := agent.sub("$a2a/v1/request/acme/#"); !granted(code) {
			t.Fatalf("%s: subscribe: %d", b.name, code)
		}
		if code := agent.sub("$a2a/v1/discovery/acme/#"); !granted(code) {
			t.Fatalf("%s: subscribe: %d", b.name, code)
		}
		agent.expect("$a2a/v1/discovery/acme/u/caller", "card") // retained although nobody listened
		if code := caller.pub(requestTopic, "now someone listens"); code != 0 {
			t.Errorf("%s: publish with a subscriber: PUBACK %#x, want 0", b.name, code)
		}
		agent.expect(requestTopic, "now someone listens")
	})
}

// Clients that are not paho, here Debian's libmosquitto tools with MQTT v5:
// a QoS 1 publish with user properties gets a PUBACK they accept (mochi
// used to copy the properties into the PUBACK and add reason 0x01, which
// MQTT.js refuses; NoInheritedPropertiesOnAck is on), 0x10 when nobody
// listens, and a request/reply round trip with mosquitto_rr works.
func TestNonGoClients(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"mosquitto_pub", "mosquitto_sub", "mosquitto_rr"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (package mosquitto-clients, hack/install-mosquitto.sh): %v", tool, err)
		}
	}
	forEachBroker(t, func(t *testing.T, b *broker) {
		d := fleet()
		grant(d, roleCaller, allow(acl.SubscribeLiteral, "$a2a/v1/reply/acme/u/caller/rr", 0))
		apply(t, b, d)
		host, port, _ := strings.Cut(b.addr, ":")
		base := []string{"-h", host, "-p", port, "-V", "5", "-u", userCaller, "-P", pwCaller, "-i", "acme/u/caller"}

		// Nobody subscribed: 0x10, and the tool takes it in its stride.
		out := run(t, "mosquitto_pub", append(base, "-d", "-q", "1", "-t", requestTopic, "-m", "hello",
			"-D", "publish", "user-property", "a2a-context-id", "ctx-1")...)
		if rc := pubackCode(t, out); rc != noMatchingSubscribers {
			t.Errorf("%s: mosquitto_pub without subscribers: PUBACK RC %d, want 16\n%s", b.name, rc, out)
		}

		// A responder (paho) answers the request mosquitto_rr sends.
		agent := mustDial(t, b, userAgent, pwAgent, "acme/u/agent")
		if code := agent.sub("$a2a/v1/request/acme/#"); !granted(code) {
			t.Fatalf("%s: subscribe: %d", b.name, code)
		}
		go func() {
			p, err := agent.next(10 * time.Second)
			if err != nil {
				return
			}
			_, _ = agent.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: []byte("pong:" + string(p.Payload)),
				Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData,
					User: paho.UserProperties{{Key: "a2a-context-id", Value: "ctx-1"}}}})
		}()
		out = run(t, "mosquitto_rr", append(base, "-q", "1", "-t", requestTopic, "-e", "$a2a/v1/reply/acme/u/caller/rr", "-m", "ping",
			"-D", "publish", "user-property", "a2a-context-id", "ctx-1", "-W", "10")...)
		if strings.TrimSpace(out) != "pong:ping" {
			t.Errorf("%s: mosquitto_rr got %q, want pong:ping", b.name, out)
		}

		// With a subscriber and user properties on the publish: PUBACK 0.
		out = run(t, "mosquitto_pub", append(base, "-d", "-q", "1", "-t", requestTopic, "-m", "again",
			"-D", "publish", "user-property", "a2a-context-id", "ctx-1")...)
		if rc := pubackCode(t, out); rc != 0 {
			t.Errorf("%s: mosquitto_pub with a subscriber: PUBACK RC %d, want 0\n%s", b.name, rc, out)
		}
	})
}

var pubackRC = regexp.MustCompile(`received PUBACK \(Mid: \d+, RC:(\d+)\)`)

func pubackCode(t *testing.T, out string) int {
	t.Helper()
	m := pubackRC.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no PUBACK in the tool's output:\n%s", out)
	}
	rc, _ := strconv.Atoi(m[1])
	return rc
}

func run(t *testing.T, tool string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, args, err, out)
	}
	return string(out)
}

// The embedded broker tells subscribers who published: identity.SenderProperty
// carries the publisher's broker username on every message it routes
// (Wills too), and a copy the client sent is dropped, so it cannot be
// forged. Mosquitto 2.0 cannot set it; there the client's copy passes through
// untouched, so on Mosquitto its presence proves nothing (docs/broker.md).
func TestSenderProperty(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b *broker) {
		d := fleet()
		grant(d, roleAgent, allow(acl.PublishClientSend, "$a2a/v1/discovery/acme/u/agent", 0))
		apply(t, b, d)
		agent := mustDial(t, b, userAgent, pwAgent, "acme/u/agent")
		if code := agent.sub("$a2a/v1/request/acme/#"); !granted(code) {
			t.Fatalf("%s: subscribe: %d", b.name, code)
		}
		caller := mustDial(t, b, userCaller, pwCaller, "acme/u/caller")
		_, err := caller.PublishWith(&paho.Publish{Topic: requestTopic, QoS: 1, Payload: []byte("forged"),
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: identity.SenderProperty, Value: "a2a:conversation-service"}, {Key: "keep", Value: "me"}}}})
		if err != nil {
			t.Fatalf("%s: publish: %v", b.name, err)
		}
		p := agent.Expect(requestTopic, "forged")
		senders := values(p, identity.SenderProperty)
		if p.Properties.User.Get("keep") != "me" {
			t.Errorf("%s: other user properties must pass through: %v", b.name, p.Properties.User)
		}
		switch b.name {
		case "embedded":
			if len(senders) != 1 || senders[0] != userCaller {
				t.Errorf("embedded: %s = %v, want exactly [%s] (the forged copy dropped)", identity.SenderProperty, senders, userCaller)
			}
		default:
			if len(senders) != 1 || senders[0] != "a2a:conversation-service" {
				t.Errorf("mosquitto: expected the client's copy to pass through unchanged (Mosquitto cannot set it), got %v", senders)
			}
		}

		// Wills carry it too (embedded).
		watcher := mustDial(t, b, b.adminUser, b.adminPass, "watcher")
		if code := watcher.sub("$a2a/v1/discovery/#"); !granted(code) {
			t.Fatalf("%s: subscribe: %d", b.name, code)
		}
		dying, err := dial(t, b, userAgent, pwAgent, "acme/u/agent-2", &will{topic: "$a2a/v1/discovery/acme/u/agent", payload: "offline"})
		if err != nil {
			t.Fatal(err)
		}
		dying.drop()
		w := watcher.Expect("$a2a/v1/discovery/acme/u/agent", "offline")
		if got := values(w, identity.SenderProperty); b.name == "embedded" && (len(got) != 1 || got[0] != userAgent) {
			t.Errorf("embedded: Will %s = %v, want [%s]", identity.SenderProperty, got, userAgent)
		}
	})
}

// grant adds ACLs to one role of d.
func grant(d acl.Desired, role string, acls ...acl.ACL) {
	r := d.Roles[role]
	r.ACLs = append(r.ACLs, acls...)
	d.Roles[role] = r
}

func values(p *paho.Publish, key string) []string {
	var out []string
	if p.Properties == nil {
		return nil
	}
	for _, u := range p.Properties.User {
		if u.Key == key {
			out = append(out, u.Value)
		}
	}
	return out
}

// Non-Go subscribers see the sender too (mosquitto_sub prints user
// properties with %P).
func TestSenderPropertyForNonGoSubscribers(t *testing.T) {
	t.Parallel()
	b := startEmbedded(t)
	apply(t, b, fleet())
	host, port, _ := strings.Cut(b.addr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	sub := exec.CommandContext(ctx, "mosquitto_sub", "-h", host, "-p", port, "-V", "5", "-u", userAgent, "-P", pwAgent,
		"-i", "acme/u/agent", "-t", "$a2a/v1/request/acme/#", "-C", "1", "-F", "%t %P %p")
	out := &strings.Builder{}
	sub.Stdout, sub.Stderr = out, out
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	caller := mustDial(t, b, userCaller, pwCaller, "acme/u/caller")
	// Publish until mosquitto_sub has subscribed (0x10 means not yet).
	for code := byte(noMatchingSubscribers); code == noMatchingSubscribers; {
		if ctx.Err() != nil {
			t.Fatalf("mosquitto_sub never subscribed: %s", out)
		}
		if code = caller.pub(requestTopic, "hello"); code == noMatchingSubscribers {
			time.Sleep(20 * time.Millisecond) // polling: mosquitto_sub is still starting
		}
	}
	if err := sub.Wait(); err != nil {
		t.Fatalf("mosquitto_sub: %v\n%s", err, out)
	}
	want := requestTopic + " " + identity.SenderProperty + ":" + userCaller + " hello"
	if strings.TrimSpace(out.String()) != want {
		t.Errorf("mosquitto_sub printed %q, want %q", out, want)
	}
}
