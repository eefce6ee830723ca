package security_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// The conversation service's side of "safe to share" (docs/security.md, attacks 10-15), replayed
// with plain paho clients against the real operator, the real service and real brokers, as a
// namespace owner with only namespace rights would: its own namespace's Agents, their own broker
// credentials.

// serviceBroker is a broker of kind with Mosquitto's production settings (dynsec, the
// sender-stamp plugin unless withoutStamp, max_packet_size 1 MiB), and its log (Mosquitto).
type serviceBroker struct {
	backend   acl.Backend
	url, addr string
	log       func() string
}

func startServiceBroker(t testing.TB, ctx context.Context, kind string, withoutStamp bool) serviceBroker {
	t.Helper()
	if kind == "mosquitto" {
		m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{MaxPacketSize: 1 << 20,
			DynSec: &brokertest.DynSecOptions{WithoutSenderPlugin: withoutStamp}})
		user, pass := m.DynSecAdmin()
		ds, err := dynsec.Connect(ctx, dynsec.Config{URL: m.URL(), Username: user, Password: pass})
		if err != nil {
			t.Fatalf("connect dynsec: %v", err)
		}
		t.Cleanup(func() { _ = ds.Close(context.Background()) })
		return serviceBroker{backend: ds, url: m.URL(), addr: m.Addr(), log: m.Log}
	}
	if kind == testenv.TableKind {
		m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{MaxPacketSize: 1 << 20,
			Table: &brokertest.TableOptions{WithoutSenderPlugin: withoutStamp}})
		user, pass := m.TableAdmin()
		tb, err := mosqtable.Connect(ctx, mosqtable.Config{URL: m.URL(), Username: user, Password: pass})
		if err != nil {
			t.Fatalf("connect decision table: %v", err)
		}
		t.Cleanup(func() { _ = tb.Close(context.Background()) })
		return serviceBroker{backend: tb, url: m.URL(), addr: m.Addr(), log: m.Log}
	}
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", MaxPacketSize: 1 << 20})
	if err != nil {
		t.Fatalf("start embedded broker: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return serviceBroker{backend: srv.Backend(), url: srv.URL(), addr: srv.Addr(), log: func() string { return "" }}
}

// serviceWorld: tenant "victim" (org victim-{suffix}) binds namespace victim, whose console calls
// its gated helper (selected by label); namespace evil is bound by no Tenant (org = its name), with
// a gated "trap" that selects every Agent of every namespace (no AgentGrant anywhere) and an
// attacker, mallory. Both gated agents answer through plain paho responders; the service runs in
// process on the broker.
type serviceWorld struct {
	b                    serviceBroker
	victim, evil, system string
	victimOrg            string
	console, helper      a2amqtt.AgentRef
	trap, mallory        a2amqtt.AgentRef
	passwords            map[a2amqtt.AgentRef]string
	svc                  *convservice.Service
	reg                  *prometheus.Registry
	responders           map[a2amqtt.AgentRef]*responder
	// durable makes the service's store fsync as in production (the benchmark); tests skip it.
	durable bool
}

func newServiceWorld(t testing.TB, ctx context.Context, b serviceBroker, rate float64, burst int) *serviceWorld {
	t.Helper()
	w := &serviceWorld{b: b, passwords: map[a2amqtt.AgentRef]string{}, responders: map[a2amqtt.AgentRef]*responder{}}
	w.victim, w.evil, w.system = cp.NewNamespace(t, ctx, "svc-victim-"), cp.NewNamespace(t, ctx, "svc-evil-"), cp.NewNamespace(t, ctx, "svc-sys-")
	w.victimOrg = "victim-" + strings.TrimPrefix(w.victim, "svc-victim-")
	tn := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: w.victimOrg}, Spec: a2av1.TenantSpec{OrgID: w.victimOrg, Namespaces: []string{w.victim}}}
	if err := k8s.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), tn) })
	policy := `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed}
spec: {agentSelector: {matchLabels: {conversations: governed}}}
`
	mustCreate(t, ctx, w.victim, policy)
	mustCreate(t, ctx, w.evil, policy)
	w.console = a2amqtt.AgentRef{Org: w.victimOrg, Unit: "demo", Agent: "console"}
	w.helper = a2amqtt.AgentRef{Org: w.victimOrg, Unit: "demo", Agent: "helper"}
	w.trap = a2amqtt.AgentRef{Org: w.evil, Unit: "x", Agent: "trap"}
	w.mallory = a2amqtt.AgentRef{Org: w.evil, Unit: "x", Agent: "mallory"}
	mustCreate(t, ctx, w.victim, agentYAML("console", w.victimOrg, "demo", "{role: console}", ""))
	mustCreate(t, ctx, w.victim, agentYAML("helper", w.victimOrg, "demo", "{conversations: governed}",
		"  callers: {from: [{agentSelector: {matchLabels: {role: console}}}]}\n"))
	mustCreate(t, ctx, w.evil, agentYAML("trap", w.evil, "x", "{conversations: governed}",
		"  callers: {from: [{agentSelector: {}, namespaceSelector: {}}]}\n"))
	mustCreate(t, ctx, w.evil, agentYAML("mallory", w.evil, "x", "", ""))

	if err := registration.EnsureServiceCredentials(ctx, k8s, b.backend, client.ObjectKey{Namespace: w.system, Name: "service"}); err != nil {
		t.Fatalf("service identity: %v", err)
	}
	cp.StartOperatorWith(t, ctx, testenv.Operator{Namespaces: map[string]string{"v": w.victim, "e": w.evil, "s": w.system},
		Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend}, Controllers: controllers.Options{Gating: true}})
	for _, a := range []struct {
		ns  string
		ref a2amqtt.AgentRef
	}{{w.victim, w.console}, {w.victim, w.helper}, {w.evil, w.trap}, {w.evil, w.mallory}} {
		w.passwords[a.ref] = ready(t, ctx, a.ns, a.ref.Agent)
	}

	w.startService(t, ctx, "sec", rate, burst)
	w.responders[w.trap] = startResponder(t, ctx, b.addr, w.trap, w.passwords[w.trap], "INJECTED BY EVIL")
	w.responders[w.helper] = startResponder(t, ctx, b.addr, w.helper, w.passwords[w.helper], "hello from helper")
	return w
}

// startService runs a service replica in process (closing the one before) with the given
// per-caller rate, and waits until it consumes both gated agents.
func (w *serviceWorld) startService(t testing.TB, ctx context.Context, replica string, rate float64, burst int) {
	t.Helper()
	if w.svc != nil {
		_ = w.svc.Close()
	}
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.system, Name: "service"}, s); err != nil {
		t.Fatal(err)
	}
	w.reg = prometheus.NewRegistry()
	svc, err := convservice.Start(ctx, convservice.Config{
		BrokerURL: w.b.url, Username: string(s.Data["username"]), Password: string(s.Data["password"]), ReplicaID: replica,
		Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: !w.durable, RestConfig: cp.Config,
		ResyncInterval: 300 * time.Millisecond, Registry: w.reg, CallerRate: rate, CallerBurst: burst,
		SessionExpiry: -1, // no session left behind by a replica the benchmark replaces
	})
	if err != nil {
		t.Fatalf("start conversation service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	w.svc = svc
	eventually(t, "the service consumes both gated agents", func() error {
		if got := strings.Join(svc.GatedAgents(), ","); got != strings.Join([]string{w.trap.String(), w.helper.String()}, ",") &&
			got != strings.Join([]string{w.helper.String(), w.trap.String()}, ",") {
			return fmt.Errorf("gated agents %q", got)
		}
		return nil
	})
}

// counter reads one sample of a counter vector from the service's registry.
func (w *serviceWorld) counter(t testing.TB, name, label, value string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func (w *serviceWorld) rejections(t testing.TB, reason string) float64 {
	return w.counter(t, "a2a_conversation_rejections_total", "reason", reason)
}

// rawClient is a plain paho v5 client that keeps what it receives.
type rawClient struct {
	id   a2amqtt.AgentRef
	c    *paho.Client
	mu   sync.Mutex
	got  []*paho.Publish
	more chan struct{}
}

func dialRaw(t testing.TB, ctx context.Context, addr string, id a2amqtt.AgentRef, password string, subscribe ...string) *rawClient {
	t.Helper()
	r := &rawClient{id: id, more: make(chan struct{}, 1)}
	// The suites' test client; what it receives is kept here, unbounded.
	c, err := brokertest.Dial(t, addr, brokertest.Options{Username: identity.BrokerPrefix + id.ClientID(), ClientID: id.ClientID(),
		Password: password, IgnoreMessages: true})
	if err != nil {
		t.Fatalf("%s connect: %v", id, err)
	}
	r.c = c.Paho()
	r.c.AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		r.mu.Lock()
		r.got = append(r.got, pr.Packet)
		r.mu.Unlock()
		select {
		case r.more <- struct{}{}:
		default:
		}
		return true, nil
	})
	for _, topic := range subscribe {
		sa, err := r.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}})
		if err != nil || sa.Reasons[0] >= 0x80 {
			t.Fatalf("%s subscribe %s: %v %v", id, topic, err, sa)
		}
	}
	return r
}

// listen dials id with a subscription to every reply topic of its own.
func (w *serviceWorld) listen(t testing.TB, ctx context.Context, id a2amqtt.AgentRef) *rawClient {
	return dialRaw(t, ctx, w.b.addr, id, w.passwords[id], id.Topic(a2amqtt.MethodReply)+"/#")
}

// since returns what arrived after the first n messages.
func (r *rawClient) since(n int) []*paho.Publish {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*paho.Publish(nil), r.got[min(n, len(r.got)):]...)
}

func (r *rawClient) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// waitFor waits until a message with correlation data corr arrived (after the first n).
func (r *rawClient) waitFor(n int, corr []byte, d time.Duration) *paho.Publish {
	deadline := time.After(d)
	for {
		for _, p := range r.since(n) {
			if p.Properties != nil && string(p.Properties.CorrelationData) == string(corr) {
				return p
			}
		}
		select {
		case <-r.more:
		case <-deadline:
			return nil
		}
	}
}

func (r *rawClient) publish(t testing.TB, ctx context.Context, p *paho.Publish) byte {
	t.Helper()
	resp, err := r.c.Publish(ctx, p)
	if err != nil && resp == nil {
		t.Fatalf("%s publish %s: %v", r.id, p.Topic, err)
	}
	return resp.ReasonCode
}

// request is a QoS 1 A2A request from r with the given reply path.
func request(topic, respTo string, corr []byte, payload string, forgedSender string) *paho.Publish {
	props := &paho.PublishProperties{ResponseTopic: respTo, CorrelationData: corr, ContentType: "application/json"}
	if forgedSender != "" {
		props.User = paho.UserProperties{{Key: identity.SenderProperty, Value: forgedSender}}
	}
	return &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload), Properties: props}
}

func sendMessage(text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":"r-1","method":"SendMessage","params":{"message":{"messageId":%q,"taskId":%q,"contextId":%q,"role":"ROLE_USER","parts":[{"text":%q}]}}}`,
		uuid.NewString(), uuid.NewString(), uuid.NewString(), text)
}

// responder is a gated agent answering every SendMessage on its delivery topic with a completed
// task saying answer; it keeps the replies it sent (for the replay).
type responder struct {
	*rawClient
	mu   sync.Mutex
	sent []*paho.Publish
}

func startResponder(t testing.TB, ctx context.Context, addr string, id a2amqtt.AgentRef, password, answer string) *responder {
	t.Helper()
	r := &responder{}
	r.rawClient = dialRaw(t, ctx, addr, id, password)
	r.c.AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		go r.answer(pr.Packet, answer)
		return true, nil
	})
	sa, err := r.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: identity.DeliveryTopic(id), QoS: 1}}})
	if err != nil || sa.Reasons[0] >= 0x80 {
		t.Fatalf("%s subscribe its delivery topic: %v %v", id, err, sa)
	}
	return r
}

func (r *responder) answer(p *paho.Publish, answer string) {
	var req struct {
		ID     any `json:"id"`
		Params struct {
			Message struct {
				TaskID    string `json:"taskId"`
				ContextID string `json:"contextId"`
			} `json:"message"`
		} `json:"params"`
	}
	if p.Properties == nil || p.Properties.ResponseTopic == "" || json.Unmarshal(p.Payload, &req) != nil {
		return
	}
	m := req.Params.Message
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"task": map[string]any{
		"id": m.TaskID, "contextId": m.ContextID, "status": map[string]any{"state": "TASK_STATE_COMPLETED",
			"message": map[string]any{"messageId": uuid.NewString(), "role": "ROLE_AGENT", "parts": []any{map[string]any{"text": answer}}}}}}})
	out := &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: body,
		Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData, ContentType: "application/json"}}
	r.mu.Lock()
	r.sent = append(r.sent, out)
	r.mu.Unlock()
	_, _ = r.c.Publish(context.Background(), out)
}

func (r *responder) lastSent() *paho.Publish {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) == 0 {
		return nil
	}
	return r.sent[len(r.sent)-1]
}

// TestServiceAttacks replays H1 (the service publishing into another org's reply topics: the
// selector trick and the -32005, -32700 and -32602 error paths, each with a forged sender
// property), M1 (a refused squatter of the caller's identity), a flood and a replayed reply, on
// Mosquitto 2.0.11 with dynsec and the sender-stamp plugin, on Mosquitto with the sender stamp
// and the decision-table plugin, and on the embedded broker.
func TestServiceAttacks(t *testing.T) {
	for _, kind := range append(slices.Clone(testenv.BrokerKinds), testenv.TableKind) {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			w := newServiceWorld(t, ctx, startServiceBroker(t, ctx, kind, false), 20, 10)
			serviceAttacks(t, ctx, w)
		})
	}
}

func serviceAttacks(t *testing.T, ctx context.Context, w *serviceWorld) {
	console, mallory := w.listen(t, ctx, w.console), w.listen(t, ctx, w.mallory)
	forged := identity.BrokerPrefix + w.console.ClientID()

	// Controls: each path works for the one it belongs to, so a refusal below means something.
	corr := []byte("console-" + uuid.NewString())
	console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("c"), corr, sendMessage("hi"), ""))
	if p := console.waitFor(0, corr, 15*time.Second); p == nil || !strings.Contains(string(p.Payload), "hello from helper") {
		t.Fatalf("the console's own request to its helper was not answered: %v", p)
	}
	corr = []byte("mallory-" + uuid.NewString())
	mallory.publish(t, ctx, request(w.trap.RequestTopic(), w.mallory.ReplyTopic("m"), corr, sendMessage("hi"), ""))
	if p := mallory.waitFor(0, corr, 15*time.Second); p == nil || !strings.Contains(string(p.Payload), "INJECTED BY EVIL") {
		t.Fatalf("mallory's own request to its trap was not answered: %v", p)
	}

	t.Run("H1: nothing reaches another org's reply topic", func(t *testing.T) {
		victimTopic := w.console.ReplyTopic("injected")
		before := console.count()
		refusedBefore := w.rejections(t, "reply_topic_not_permitted")
		variants := []struct {
			name    string
			publish *paho.Publish
		}{
			{"a reply through a selector of every namespace", request(w.trap.RequestTopic(), victimTopic, []byte("h1-a"), sendMessage("inject"), forged)},
			{"-32005 for missing correlation data", request(w.trap.RequestTopic(), victimTopic, nil, sendMessage("inject"), forged)},
			{"-32700 for malformed JSON", request(w.trap.RequestTopic(), victimTopic, []byte("h1-c"), `{"jsonrpc": "2.0", "method": `, forged)},
			{"-32602 from the history endpoint", request(identity.Service.RequestTopic(), victimTopic, []byte("h1-d"),
				`{"jsonrpc":"2.0","id":"h","method":"ListTasks","params":{}}`, forged)},
		}
		for _, v := range variants {
			if code := mallory.publish(t, ctx, v.publish); code >= 0x80 {
				t.Fatalf("%s: the broker refused mallory's publish (0x%02x): the attack is not replayed", v.name, code)
			}
		}
		time.Sleep(2 * time.Second) // what was not refused would have been answered by now
		for _, p := range console.since(before) {
			t.Errorf("the service published into the console's reply topic %s: %s", p.Topic, p.Payload)
		}
		if got := w.rejections(t, "reply_topic_not_permitted") - refusedBefore; got != 4 {
			t.Errorf("rejections_total{reply_topic_not_permitted} grew by %v, want 4", got)
		}
	})

	t.Run("a replayed reply is dropped once its route is finished", func(t *testing.T) {
		corr := []byte("replay-" + uuid.NewString())
		n := console.count()
		console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("r"), corr, sendMessage("once"), ""))
		if p := console.waitFor(n, corr, 10*time.Second); p == nil {
			t.Fatal("no reply")
		}
		helper := w.responders[w.helper]
		reply := helper.lastSent()
		dropped := w.counter(t, "a2a_conversation_replies_total", "outcome", "dropped_replay")
		if code := helper.publish(t, ctx, reply); code >= 0x80 {
			t.Fatalf("the helper may not publish its reply again (0x%02x): the attack is not replayed", code)
		}
		time.Sleep(time.Second) // a relayed replay would have arrived by now
		var replies int
		for _, p := range console.since(n) {
			if string(p.Properties.CorrelationData) == string(corr) {
				replies++
			}
		}
		if replies != 1 {
			t.Errorf("the console got %d replies to one request", replies)
		}
		if got := w.counter(t, "a2a_conversation_replies_total", "outcome", "dropped_replay"); got != dropped+1 {
			t.Errorf("replies_total{dropped_replay} = %v, want %v", got, dropped+1)
		}
	})

	t.Run("a retry of a finished task is answered, once (its first reply may have been lost)", func(t *testing.T) {
		// The requester repeats the message with fresh correlation data, as the SDK does when
		// no answer came (found on kind: a broker restarted on an empty volume lost the relayed
		// replies, and the retries' answers were dropped as replays).
		payload := sendMessage("again")
		first, retry := []byte("first-"+uuid.NewString()), []byte("retry-"+uuid.NewString())
		n := console.count()
		console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("retry"), first, payload, ""))
		if p := console.waitFor(n, first, 10*time.Second); p == nil {
			t.Fatal("no reply to the first attempt")
		}
		dropped := w.counter(t, "a2a_conversation_replies_total", "outcome", "dropped_replay")
		console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("retry"), retry, payload, ""))
		p := console.waitFor(n, retry, 10*time.Second)
		if p == nil || !strings.Contains(string(p.Payload), "hello from helper") {
			t.Fatalf("the retry of the finished task was not answered with it: %v", p)
		}
		if got := w.counter(t, "a2a_conversation_replies_total", "outcome", "dropped_replay"); got != dropped {
			t.Errorf("replies_total{dropped_replay} grew by %v for a retry", got-dropped)
		}
		// The retry's own route ends with its answer: a replay of that answer is dropped.
		helper := w.responders[w.helper]
		if code := helper.publish(t, ctx, helper.lastSent()); code >= 0x80 {
			t.Fatalf("the helper may not publish its reply again (0x%02x)", code)
		}
		time.Sleep(time.Second) // a relayed replay would have arrived by now
		var replies int
		for _, p := range console.since(n) {
			if string(p.Properties.CorrelationData) == string(retry) {
				replies++
			}
		}
		if replies != 1 {
			t.Errorf("the console got %d replies to the retry, want 1", replies)
		}
		if got := w.counter(t, "a2a_conversation_replies_total", "outcome", "dropped_replay"); got != dropped+1 {
			t.Errorf("replies_total{dropped_replay} = %v after a replay of the retry's answer, want %v", got, dropped+1)
		}
	})

	t.Run("a flood is answered rate_limited with retry_after; the other tenant is served", func(t *testing.T) {
		limited, unanswered := w.rejections(t, rpcerr.NameRateLimited), w.rejections(t, "rate_limited_unanswered")
		n := mallory.count()
		const flood = 100
		for i := range flood {
			mallory.publish(t, ctx, request(w.trap.RequestTopic(), w.mallory.ReplyTopic("flood"), []byte(fmt.Sprintf("flood-%d", i)), sendMessage("flood"), ""))
		}
		for round := range 3 {
			corr := []byte(fmt.Sprintf("victim-%d", round))
			c := console.count()
			console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("v"), corr, sendMessage("during the flood"), ""))
			if p := console.waitFor(c, corr, 10*time.Second); p == nil || !strings.Contains(string(p.Payload), "hello from helper") {
				t.Fatalf("the victim tenant's request was not served during the flood: %v", p)
			}
		}
		// Every flood request is served, answered rate_limited, or (beyond twice the rate: the
		// answers have a bucket of their own) dropped unanswered and counted.
		var served, rateLimited int
		eventually(t, "every flood request accounted for", func() error {
			served, rateLimited = 0, 0
			for _, p := range mallory.since(n) {
				var r struct {
					Error *struct {
						Code int `json:"code"`
						Data struct {
							Kind       string  `json:"a2a_error"`
							RetryAfter float64 `json:"retry_after"`
						} `json:"data"`
					} `json:"error"`
				}
				switch {
				case json.Unmarshal(p.Payload, &r) != nil:
					return fmt.Errorf("not JSON-RPC: %s", p.Payload)
				case r.Error == nil:
					served++
				case r.Error.Code != convservice.CodeRateLimited || r.Error.Data.Kind != rpcerr.NameRateLimited || r.Error.Data.RetryAfter <= 0:
					return fmt.Errorf("a refusal that is not rate_limited with retry_after: %s", p.Payload)
				default:
					rateLimited++
				}
			}
			dropped := int(w.rejections(t, "rate_limited_unanswered") - unanswered)
			if served+rateLimited+dropped != flood {
				return fmt.Errorf("%d served + %d rate_limited + %d unanswered != %d", served, rateLimited, dropped, flood)
			}
			return nil
		})
		// 20/s with bursts of 10: most of 100 back-to-back requests are beyond it.
		if served > flood/2 || rateLimited == 0 {
			t.Errorf("%d of %d flood requests served, %d answered rate_limited", served, flood, rateLimited)
		}
		if got := w.rejections(t, rpcerr.NameRateLimited) - limited; int(got) != rateLimited {
			t.Errorf("rejections_total{rate_limited} = %v, answers %d", got, rateLimited)
		}
	})

	t.Run("M1: a refused squatter leaves no trace", func(t *testing.T) {
		mustCreate(t, ctx, w.evil, agentYAML("console-squat", w.victimOrg, "demo", "{role: console}", "  agentID: console\n"))
		a := condition(t, ctx, w.evil, "console-squat", a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted, "")
		if a.Status.ClientID != "" || a.Status.Topics != nil {
			t.Errorf("the refused squatter shows client ID %q and topics %+v", a.Status.ClientID, a.Status.Topics)
		}
		// Across several of the service's resyncs, the console's requests are still relayed.
		for round := range 6 {
			time.Sleep(400 * time.Millisecond)
			corr := []byte(fmt.Sprintf("m1-%d-%s", round, uuid.NewString()))
			n := console.count()
			console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("m1"), corr, sendMessage("still me"), ""))
			if p := console.waitFor(n, corr, 10*time.Second); p == nil || !strings.Contains(string(p.Payload), "hello from helper") {
				t.Fatalf("round %d: the console's request was not relayed with a squatter of its identity around (%v)", round, p)
			}
		}
	})
}

// TestServiceDropsUnstampedRequests: on a Mosquitto without the sender-stamp plugin the service
// cannot know who published, so it answers nobody (not even a legitimate caller) and counts it.
func TestServiceDropsUnstampedRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newServiceWorld(t, ctx, startServiceBroker(t, ctx, "mosquitto", true), 20, 10)
	console := w.listen(t, ctx, w.console)
	unknown := w.rejections(t, "sender_unknown")
	corr := []byte("unstamped")
	console.publish(t, ctx, request(w.helper.RequestTopic(), w.console.ReplyTopic("u"), corr, sendMessage("hi"), ""))
	eventually(t, "the unstamped request counted", func() error {
		if got := w.rejections(t, "sender_unknown"); got != unknown+1 {
			return fmt.Errorf("sender_unknown %v, want %v", got, unknown+1)
		}
		return nil
	})
	if p := console.waitFor(0, corr, time.Second); p != nil {
		t.Fatalf("an unstamped request was answered: %s", p.Payload)
	}
}

// TestCardLimits replays M2: a card the broker's packet limit cannot carry is refused at
// admission, a card over the Tenant's maxCardBytes is not published (CardTooLarge), and the
// operator's shared connection keeps publishing other Agents' cards.
func TestCardLimits(t *testing.T) {
	for _, kind := range append(slices.Clone(testenv.BrokerKinds), testenv.TableKind) {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			b := startServiceBroker(t, ctx, kind, false)
			ns := cp.NewNamespace(t, ctx, "card-")
			cp.StartOperatorWith(t, ctx, testenv.Operator{Namespaces: map[string]string{"n": ns},
				Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend}})
			skills := func(n int) string {
				var s strings.Builder
				s.WriteString("    skills:\n")
				for i := range n {
					fmt.Fprintf(&s, "    - {id: s%d, name: s, description: %s, examples: [%s]}\n", i, strings.Repeat("d", 4096),
						strings.TrimSuffix(strings.Repeat(strings.Repeat("e", 1024)+", ", 16), ", "))
				}
				return s.String()
			}
			card := func(name string, n int) string {
				return fmt.Sprintf("apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata: {name: %s}\nspec:\n  orgID: %s\n  unitID: u\n  card:\n    name: %s\n    description: d\n%s",
					name, ns, name, skills(n))
			}
			// ~1.3 MB of text: more than the broker's 1 MiB packets, refused before anything runs.
			if err := create(t, ctx, k8s, ns, card("huge", 64)); err == nil || !strings.Contains(err.Error(), "more than 256 KiB") {
				t.Fatalf("a 1.3 MB card was not refused at admission: %v", err)
			}
			// ~100 KB: within admission's bound, over the default 64 KiB limit.
			mustCreate(t, ctx, ns, card("big", 5))
			condition(t, ctx, ns, "big", a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonCardTooLarge, "more than the 65536")
			// The shared card connection still works: an Agent created afterwards gets its card,
			// and the oversized one is not on the broker.
			mustCreate(t, ctx, ns, agentYAML("small", ns, "u", "", ""))
			small := connectAgent(t, ctx, b.addr, ns+"/u/small", ready(t, ctx, ns, "small"))
			if _, ok := readRetained(t, ctx, small, "$a2a/v1/discovery/"+ns+"/u/small"); !ok {
				t.Fatal("the Agent created after the oversized card got no card")
			}
			if card, ok := readRetained(t, ctx, small, "$a2a/v1/discovery/"+ns+"/u/big"); ok {
				t.Fatalf("the oversized card was published (%d bytes)", len(card))
			}
			if strings.Contains(b.log(), "oversize") {
				t.Fatalf("the broker disconnected a client for an oversized packet:\n%s", b.log())
			}
		})
	}
}
