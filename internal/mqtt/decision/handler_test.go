package decision_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/decision"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

const (
	userCaller = "a2a:acme/u/caller"
	userAgent  = "a2a:acme/u/agent"
	pwCaller   = "caller-pw"
	pwAgent    = "agent-pw"
)

// table is a real embedded.Store (the decision table every other backend checks) holding a
// caller that may send acme requests except to "secret" (a higher-priority deny) and read its
// replies, and an agent with a fixed client ID that reads acme requests.
func table(t testing.TB) *embedded.Store {
	t.Helper()
	s, err := embedded.NewStore(embedded.StoreConfig{AdminUsername: "admin", AdminPassword: "admin-pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	allow := func(ty acl.ACLType, topic string, prio int) acl.ACL {
		return acl.ACL{Type: ty, Topic: topic, Priority: prio, Allow: true}
	}
	st := acl.NewState([]acl.Role{
		{Name: "a2a:role/caller", ACLs: []acl.ACL{
			allow(acl.PublishClientSend, "$a2a/v1/request/acme/#", 0),
			{Type: acl.PublishClientSend, Topic: "$a2a/v1/request/acme/secret", Priority: 10},
			allow(acl.SubscribePattern, "$a2a/v1/reply/acme/u/caller/#", 0),
		}},
		{Name: "a2a:role/agent", ACLs: []acl.ACL{allow(acl.SubscribePattern, "$a2a/v1/request/acme/#", 0)}},
	}, nil, []acl.Client{
		{Username: userCaller, Roles: []acl.RoleRef{{Name: "a2a:role/caller"}}},
		{Username: userAgent, ClientID: "acme/u/agent", Roles: []acl.RoleRef{{Name: "a2a:role/agent"}}},
	})
	st.DefaultACL = &acl.DenyByDefault
	d := acl.Desired{State: st, Passwords: map[string]string{userCaller: pwCaller, userAgent: pwAgent}}
	if _, err := acl.Apply(context.Background(), s, d); err != nil {
		t.Fatal(err)
	}
	return s
}

func serve(t *testing.T, cfg decision.Config) (*httptest.Server, *decision.Handler) {
	t.Helper()
	h, err := decision.NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, h
}

func post(t *testing.T, srv *httptest.Server, path, contentType, body string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Post(srv.URL+path, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(data)), resp.Header
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

type exchange struct {
	name, path, contentType, body string
	status                        int
	answer                        string // exact body, or a substring when prefixed with "~"
}

func (e exchange) check(t *testing.T, srv *httptest.Server) {
	t.Helper()
	status, body, _ := post(t, srv, e.path, e.contentType, e.body)
	if status != e.status {
		t.Errorf("%s: status %d, want %d (body %s)", e.name, status, e.status, body)
	}
	if sub, ok := strings.CutPrefix(e.answer, "~"); ok {
		if !strings.Contains(body, sub) {
			t.Errorf("%s: body %s, want it to contain %s", e.name, body, sub)
		}
	} else if body != e.answer {
		t.Errorf("%s: body %s, want %s", e.name, body, e.answer)
	}
}

const ctJSON = "application/json"

// TestEMQX: EMQX 5's HTTP authn and authz shapes, answered from the table.
func TestEMQX(t *testing.T) {
	srv, h := serve(t, decision.Config{Decider: table(t)})
	authn := func(u, p, c string) string {
		return jsonOf(map[string]string{"username": u, "password": p, "clientid": c})
	}
	authz := func(u, topic, action string) string {
		return jsonOf(map[string]string{"username": u, "clientid": "x", "topic": topic, "action": action})
	}
	for _, e := range []exchange{
		{"caller connects", "/emqx/authn", ctJSON, authn(userCaller, pwCaller, "any"), 200, `{"result":"allow"}`},
		{"wrong password", "/emqx/authn", ctJSON, authn(userCaller, "nope", "any"), 200, `{"result":"deny"}`},
		{"agent with its client ID", "/emqx/authn", ctJSON, authn(userAgent, pwAgent, "acme/u/agent"), 200, `{"result":"allow"}`},
		{"agent with another client ID", "/emqx/authn", ctJSON, authn(userAgent, pwAgent, "acme/u/other"), 200, `{"result":"deny"}`},
		{"unknown user", "/emqx/authn", ctJSON, authn("a2a:nobody", "x", "x"), 200, `{"result":"deny"}`},
		{"anonymous", "/emqx/authn", ctJSON, authn("", "", "x"), 200, `{"result":"deny"}`},
		{"publish a request", "/emqx/authz", ctJSON, authz(userCaller, "$a2a/v1/request/acme/u/agent", "publish"), 200, `{"result":"allow"}`},
		{"priority deny", "/emqx/authz", ctJSON, authz(userCaller, "$a2a/v1/request/acme/secret", "publish"), 200, `{"result":"deny"}`},
		{"subscribe own replies", "/emqx/authz", ctJSON, authz(userCaller, "$a2a/v1/reply/acme/u/caller/#", "subscribe"), 200, `{"result":"allow"}`},
		{"subscribe others' replies", "/emqx/authz", ctJSON, authz(userCaller, "$a2a/v1/reply/acme/u/agent/#", "subscribe"), 200, `{"result":"deny"}`},
		{"unknown user publishes", "/emqx/authz", ctJSON, authz("a2a:nobody", "$a2a/v1/request/acme/u/agent", "publish"), 200, `{"result":"deny"}`},
		{"admin", "/emqx/authz", ctJSON, authz("admin", "anything/at/all", "publish"), 200, `{"result":"allow"}`},
		{"bad action", "/emqx/authz", ctJSON, authz(userCaller, "t", "read"), 400, `~action`},
		{"missing password", "/emqx/authn", ctJSON, `{"username":"u","clientid":"c"}`, 400, `~needs username, password and clientid`},
		{"not JSON", "/emqx/authn", ctJSON, `username=u`, 400, `~decode JSON`},
		{"trailing data", "/emqx/authn", ctJSON, authn("u", "p", "c") + `{}`, 400, `~trailing`},
		{"wrong content type", "/emqx/authn", "text/plain", authn("u", "p", "c"), 415, `~content type`},
		{"unknown path", "/emqx/other", ctJSON, `{}`, 404, `~no decision endpoint`},
	} {
		e.check(t, srv)
	}
	if c := h.Counters(); c.Allowed != 5 || c.Denied != 7 || c.Malformed != 6 {
		t.Errorf("counters %+v, want 5 allowed, 7 denied, 6 malformed", c)
	}
}

// TestVerneMQ: the webhooks' bodies and answers, the subscribe modifier for a partly refused
// SUBSCRIBE, and the cache-control header.
func TestVerneMQ(t *testing.T) {
	srv, _ := serve(t, decision.Config{Decider: table(t), CacheMaxAge: 30 * time.Second})
	register := func(u, p, c string) string {
		return jsonOf(map[string]any{"peer_addr": "127.0.0.1", "peer_port": 1883, "username": u, "password": p,
			"mountpoint": "", "client_id": c, "clean_session": true})
	}
	publish := func(u, topic string) string {
		return jsonOf(map[string]any{"username": u, "client_id": "c", "mountpoint": "", "qos": 1, "topic": topic, "payload": "aGk=", "retain": false})
	}
	subscribe := func(u string, topics ...string) string {
		var ts []map[string]any
		for _, tp := range topics {
			ts = append(ts, map[string]any{"topic": tp, "qos": 1})
		}
		return jsonOf(map[string]any{"username": u, "client_id": "c", "mountpoint": "", "topics": ts})
	}
	const ok, refused = `{"result":"ok"}`, `{"result":{"error":"not_allowed"}}`
	for _, e := range []exchange{
		{"register", "/vernemq/auth_on_register", ctJSON, register(userCaller, pwCaller, "c"), 200, ok},
		{"register m5", "/vernemq/auth_on_register_m5", ctJSON, register(userAgent, pwAgent, "acme/u/agent"), 200, ok},
		{"register wrong client ID", "/vernemq/auth_on_register", ctJSON, register(userAgent, pwAgent, "c"), 200, refused},
		{"register no username", "/vernemq/auth_on_register", ctJSON, `{"client_id":"c","password":"p"}`, 200, refused},
		{"publish", "/vernemq/auth_on_publish", ctJSON, publish(userCaller, "$a2a/v1/request/acme/u/agent"), 200, ok},
		{"publish denied", "/vernemq/auth_on_publish", ctJSON, publish(userCaller, "$a2a/v1/request/acme/secret"), 200, refused},
		{"subscribe", "/vernemq/auth_on_subscribe", ctJSON, subscribe(userAgent, "$a2a/v1/request/acme/#"), 200, ok},
		{"subscribe partly", "/vernemq/auth_on_subscribe", ctJSON, subscribe(userAgent, "$a2a/v1/request/acme/#", "other/#"), 200,
			`{"result":"ok","topics":[{"topic":"$a2a/v1/request/acme/#","qos":1},{"topic":"other/#","qos":128}]}`},
		{"subscribe none", "/vernemq/auth_on_subscribe", ctJSON, subscribe(userAgent, "other/#"), 200, refused},
		{"unknown hook", "/vernemq/on_deliver", ctJSON, `{}`, 404, `~not served`},
		{"subscribe without topics", "/vernemq/auth_on_subscribe", ctJSON, `{"username":"u"}`, 400, `~needs topics`},
	} {
		e.check(t, srv)
	}
	_, _, hdr := post(t, srv, "/vernemq/auth_on_publish", ctJSON, publish(userCaller, "$a2a/v1/request/acme/u/agent"))
	if got := hdr.Get("Cache-Control"); got != "max-age=30" {
		t.Errorf("allowed answer cache-control %q, want max-age=30", got)
	}
	_, _, hdr = post(t, srv, "/vernemq/auth_on_publish", ctJSON, publish(userCaller, "$a2a/v1/request/acme/secret"))
	if got := hdr.Get("Cache-Control"); got != "" {
		t.Errorf("refusal cache-control %q, want none (a refusal is asked again)", got)
	}
	// The hook named by VerneMQ's header, on any path.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hooks", strings.NewReader(publish(userCaller, "$a2a/v1/request/acme/u/agent")))
	req.Header.Set("vernemq-hook", "auth_on_publish")
	req.Header.Set("Content-Type", ctJSON)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(body)) != ok {
		t.Errorf("hook by header: %s, want %s", body, ok)
	}
}

// TestGoAuth: mosquitto-go-auth's HTTP backend, JSON and form parameters, every acc value, and
// the text response mode.
func TestGoAuth(t *testing.T) {
	srv, _ := serve(t, decision.Config{Decider: table(t)})
	aclJSON := func(u, topic string, acc int) string {
		return jsonOf(map[string]any{"username": u, "clientid": "c", "topic": topic, "acc": acc})
	}
	const form = "application/x-www-form-urlencoded"
	yes, no := `{"error":"","ok":true}`, `{"error":"not allowed","ok":false}`
	for _, e := range []exchange{
		{"user", "/mosquitto-go-auth/user", ctJSON, jsonOf(map[string]string{"username": userCaller, "password": pwCaller, "clientid": "c"}), 200, yes},
		{"user wrong password", "/mosquitto-go-auth/user", ctJSON, jsonOf(map[string]string{"username": userCaller, "password": "x", "clientid": "c"}), 403, no},
		{"user form", "/mosquitto-go-auth/user", form, url.Values{"username": {userAgent}, "password": {pwAgent}, "clientid": {"acme/u/agent"}}.Encode(), 200, yes},
		{"user text mode", "/mosquitto-go-auth/user?response_mode=text", ctJSON, jsonOf(map[string]string{"username": userCaller, "password": pwCaller, "clientid": "c"}), 200, "ok"},
		{"superuser no", "/mosquitto-go-auth/superuser", ctJSON, jsonOf(map[string]string{"username": userCaller}), 403, no},
		{"superuser admin", "/mosquitto-go-auth/superuser", ctJSON, jsonOf(map[string]string{"username": "admin"}), 200, yes},
		{"write", "/mosquitto-go-auth/acl", ctJSON, aclJSON(userCaller, "$a2a/v1/request/acme/u/agent", decision.GoAuthWrite), 200, yes},
		{"write denied", "/mosquitto-go-auth/acl", ctJSON, aclJSON(userCaller, "$a2a/v1/request/acme/secret", decision.GoAuthWrite), 403, no},
		{"subscribe", "/mosquitto-go-auth/acl", ctJSON, aclJSON(userAgent, "$a2a/v1/request/acme/#", decision.GoAuthSubscribe), 200, yes},
		{"read (no receive rule: dynsec allows delivery by default)", "/mosquitto-go-auth/acl", ctJSON, aclJSON(userAgent, "$a2a/v1/request/acme/x", decision.GoAuthRead), 200, yes},
		{"readwrite needs both", "/mosquitto-go-auth/acl", ctJSON, aclJSON(userAgent, "$a2a/v1/request/acme/x", decision.GoAuthReadWrite), 403, no},
		{"acl form", "/mosquitto-go-auth/acl", form, url.Values{"username": {userCaller}, "clientid": {"c"}, "topic": {"$a2a/v1/reply/acme/u/caller/#"}, "acc": {"4"}}.Encode(), 200, yes},
		{"bad acc", "/mosquitto-go-auth/acl", ctJSON, aclJSON(userCaller, "t", 5), 400, `~acc 5`},
		{"acc not a number", "/mosquitto-go-auth/acl", form, "username=u&topic=t&acc=x", 400, `~not a number`},
		{"acl without topic", "/mosquitto-go-auth/acl", ctJSON, `{"username":"u","acc":2}`, 400, `~needs topic and acc`},
		{"unknown", "/mosquitto-go-auth/other", ctJSON, `{"username":"u"}`, 404, `~not served`},
	} {
		e.check(t, srv)
	}
}

// TestFailClosedUntilReady: before the first full sync nothing is allowed, in answers no
// broker caches; malformed requests are still told so.
func TestFailClosedUntilReady(t *testing.T) {
	var ready atomic.Bool
	srv, h := serve(t, decision.Config{Decider: table(t), Ready: ready.Load})
	emqx := exchange{"emqx authn", "/emqx/authn", ctJSON, jsonOf(map[string]string{"username": userCaller, "password": pwCaller, "clientid": "c"}), 200, `{"result":"deny"}`}
	emqxZ := exchange{"emqx authz", "/emqx/authz", ctJSON, jsonOf(map[string]string{"username": userCaller, "topic": "$a2a/v1/request/acme/u/agent", "action": "publish"}), 200, `{"result":"deny"}`}
	verne := exchange{"verne", "/vernemq/auth_on_publish", ctJSON, jsonOf(map[string]string{"username": userCaller, "topic": "$a2a/v1/request/acme/u/agent"}), 503, `~not synced`}
	goauth := exchange{"go-auth", "/mosquitto-go-auth/user", ctJSON, jsonOf(map[string]string{"username": userCaller, "password": pwCaller, "clientid": "c"}), 503, `~not synced`}
	for _, e := range []exchange{emqx, emqxZ, verne, goauth} {
		e.check(t, srv)
	}
	exchange{"malformed", "/mosquitto-go-auth/user", ctJSON, `{`, 400, `~decode`}.check(t, srv)
	if c := h.Counters(); c.NotReady != 4 || c.Allowed != 0 {
		t.Errorf("counters %+v, want 4 not ready, 0 allowed", c)
	}
	ready.Store(true)
	emqx.answer, emqxZ.answer = `{"result":"allow"}`, `{"result":"allow"}`
	verne.status, verne.answer = 200, `{"result":"ok"}`
	goauth.status, goauth.answer = 200, `{"error":"","ok":true}`
	for _, e := range []exchange{emqx, emqxZ, verne, goauth} {
		e.check(t, srv)
	}
}

// TestBoundedBody: a body over MaxBody is refused with 413, and only GET-less POST is served.
func TestBoundedBody(t *testing.T) {
	srv, _ := serve(t, decision.Config{Decider: table(t), MaxBody: 1024})
	big := jsonOf(map[string]string{"username": userCaller, "topic": "t", "payload": strings.Repeat("x", 4096)})
	exchange{"json", "/vernemq/auth_on_publish", ctJSON, big, 413, `~too large`}.check(t, srv)
	exchange{"form", "/mosquitto-go-auth/acl", "application/x-www-form-urlencoded", "username=u&acc=2&topic=" + strings.Repeat("x", 4096), 413, `~too large`}.check(t, srv)
	resp, err := http.Get(srv.URL + "/emqx/authn")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
		t.Errorf("GET: %d Allow=%q, want 405 Allow=POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// TestAnswersFollowTheTable: a change to the table is the next answer (the handler keeps
// nothing of its own).
func TestAnswersFollowTheTable(t *testing.T) {
	s := table(t)
	srv, _ := serve(t, decision.Config{Decider: s})
	pub := exchange{"publish", "/mosquitto-go-auth/acl", ctJSON, jsonOf(map[string]any{"username": userCaller, "topic": "$a2a/v1/request/acme/u/agent", "acc": 2}), 200, `{"error":"","ok":true}`}
	pub.check(t, srv)
	if err := s.Execute(context.Background(), []acl.Command{{Op: acl.OpRemoveClientRole, Username: userCaller, Role: "a2a:role/caller"}}); err != nil {
		t.Fatal(err)
	}
	pub.status, pub.answer = 403, `{"error":"not allowed","ok":false}`
	pub.check(t, srv)
}
