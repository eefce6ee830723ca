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

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
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

// Both brokers tell subscribers who published: identity.SenderProperty
// carries the publisher's broker username on every message they route, and a
// copy the client sent is dropped, so it cannot be forged. The embedded
// broker's hook does it; on Mosquitto 2.0 the sender-stamp plugin
// (hack/mosquitto-plugin, loaded before dynsec as config/mosquitto loads it).
// The other properties pass through in order. A Will is stamped by the
// embedded broker; Mosquitto cannot stamp a Will, so the plugin does not
// deliver Wills on request topics (where the stamp is trusted) and delivers
// them elsewhere unchanged (an agent's offline card).
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
		format := byte(1)
		_, err := caller.PublishWith(&paho.Publish{Topic: requestTopic, QoS: 1, Payload: []byte("forged"),
			Properties: &paho.PublishProperties{
				ContentType: "application/json", ResponseTopic: "$a2a/v1/reply/acme/u/caller/x", CorrelationData: []byte{0, 1, 2},
				PayloadFormat: &format,
				User: paho.UserProperties{{Key: "first", Value: "1"}, {Key: identity.SenderProperty, Value: "a2a:conversation-service"},
					{Key: "keep", Value: "me"}, {Key: identity.SenderProperty, Value: "a2a:acme/u/agent"}, {Key: "last", Value: "3"}}}})
		if err != nil {
			t.Fatalf("%s: publish: %v", b.name, err)
		}
		p := agent.Expect(requestTopic, "forged")
		if senders := values(p, identity.SenderProperty); len(senders) != 1 || senders[0] != userCaller {
			t.Errorf("%s: %s = %v, want exactly [%s] (the forged copies dropped)", b.name, identity.SenderProperty, senders, userCaller)
		}
		var others []string
		for _, u := range p.Properties.User {
			if u.Key != identity.SenderProperty {
				others = append(others, u.Key+"="+u.Value)
			}
		}
		if strings.Join(others, ",") != "first=1,keep=me,last=3" {
			t.Errorf("%s: other user properties must pass through in order: %v", b.name, p.Properties.User)
		}
		pp := p.Properties
		if pp.ContentType != "application/json" || pp.ResponseTopic != "$a2a/v1/reply/acme/u/caller/x" || string(pp.CorrelationData) != "\x00\x01\x02" ||
			pp.PayloadFormat == nil || *pp.PayloadFormat != 1 {
			t.Errorf("%s: the other properties must pass through: %+v", b.name, pp)
		}
		// Without any user property of its own the stamp is the only one.
		if code := caller.pub(requestTopic, "plain"); code != 0 {
			t.Fatalf("%s: publish: %#x", b.name, code)
		}
		if p := agent.Expect(requestTopic, "plain"); len(p.Properties.User) != 1 || p.Properties.User.Get(identity.SenderProperty) != userCaller {
			t.Errorf("%s: plain publish: user properties %v, want only the stamp", b.name, p.Properties.User)
		}

		// Wills: a forged stamp never reaches a request topic's subscriber, whether the Will
		// fires because the connection drops or because a new connection takes the session over.
		watcher := mustDial(t, b, b.adminUser, b.adminPass, "watcher")
		if code := watcher.sub("$a2a/v1/discovery/#"); !granted(code) {
			t.Fatalf("%s: subscribe: %d", b.name, code)
		}
		caller.close()
		forgedWill := func() *client {
			c, err := brokertest.Dial(t, b.addr, brokertest.Options{Username: userCaller, Password: pwCaller, ClientID: "acme/u/caller",
				Will:           &paho.WillMessage{Topic: requestTopic, Payload: []byte("forged will"), QoS: 1},
				WillProperties: &paho.WillProperties{User: paho.UserProperties{{Key: identity.SenderProperty, Value: "a2a:acme/u/someone-else"}}}})
			if err != nil {
				t.Fatal(err)
			}
			return &client{c}
		}
		noForgedWill := func(how string) {
			t.Helper()
			deadline := time.Now().Add(time.Second)
			for {
				w, err := agent.next(time.Until(deadline))
				if err != nil {
					break // nothing more within the second
				}
				if b.name != "embedded" {
					t.Errorf("%s: a Will %s was delivered on %s: %s %v", b.name, how, w.Topic, w.Payload, w.Properties.User)
				} else if got := values(w, identity.SenderProperty); len(got) != 1 || got[0] != userCaller {
					t.Errorf("embedded: Will %s: %s = %v, want [%s]", how, identity.SenderProperty, got, userCaller)
				}
			}
		}
		forgedWill().drop()
		noForgedWill("after a dropped connection")
		forgedWill()
		caller = mustDial(t, b, userCaller, pwCaller, "acme/u/caller") // takes the session over
		noForgedWill("after a take-over")
		if b.name != "embedded" && strings.Count(b.log(), "not delivering the Will of acme/u/caller on "+requestTopic) != 2 {
			t.Errorf("mosquitto: the plugin did not say it dropped both Wills:\n%s", b.log())
		}
		// ... and an agent's offline card (a Will on its discovery topic) is delivered.
		dying, err := dial(t, b, userAgent, pwAgent, "acme/u/agent-2", &will{topic: "$a2a/v1/discovery/acme/u/agent", payload: "offline"})
		if err != nil {
			t.Fatal(err)
		}
		dying.drop()
		w := watcher.Expect("$a2a/v1/discovery/acme/u/agent", "offline")
		if got := values(w, identity.SenderProperty); b.name == "embedded" && (len(got) != 1 || got[0] != userAgent) {
			t.Errorf("embedded: Will %s = %v, want [%s]", identity.SenderProperty, got, userAgent)
		}
		// The broker still works for everyone after the dropped Will.
		if code := caller.pub(requestTopic, "after"); code != 0 {
			t.Fatalf("%s: publish after the Will: %#x", b.name, code)
		}
		agent.Expect(requestTopic, "after")
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
