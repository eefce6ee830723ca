// Package decision serves the operator's decision table (the embedded broker's store and its
// acl.Policy) over HTTP, in the request and response shapes that clustered and plugin-based
// brokers call: EMQX 5's HTTP authentication and authorization, VerneMQ's webhooks
// (auth_on_register, auth_on_subscribe, auth_on_publish and their _m5 forms) and
// mosquitto-go-auth's HTTP backend (/user, /superuser, /acl). Every answer is the table's:
// a CONNECT is Authenticate, a PUBLISH, SUBSCRIBE or delivery is Allows (dynsec semantics,
// constant time per message), so a broker behind this handler decides what the embedded broker,
// Mosquitto with dynsec and the decision-table plugin decide (docs/broker.md).
//
// The package also holds the caller side of the go-auth protocol (Caller), with go-auth's
// answer cache, which the project's HTTP-auth Mosquitto plugin uses to ask this handler.
package decision

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Decider is the decision table the handler asks (embedded.Store implements it).
type Decider interface {
	// Authenticate is the CONNECT decision: a known user, its client ID when one is
	// configured, its password.
	Authenticate(username, password, clientID string) bool
	// Allows is the per-message decision (dynsec semantics).
	Allows(username string, access acl.Access, topic string) bool
	// IsAdmin reports the table's superuser.
	IsAdmin(username string) bool
}

// DefaultMaxBody bounds a request body: the largest legitimate one is a VerneMQ
// auth_on_publish carrying a message payload (base64), which the handler does not need;
// larger bodies are refused with 413 rather than read.
const DefaultMaxBody = 256 << 10

// Config configures NewHandler.
type Config struct {
	// Decider answers every request.
	Decider Decider
	// Ready reports whether the table is complete (a replica's first full sync). Until it
	// returns true every request is refused (fail closed) with an answer no broker caches:
	// HTTP 503 for go-auth and VerneMQ (an error: the broker denies and asks again), an
	// explicit "deny" for EMQX (whose 5xx means "ignore", i.e. the next source or no_match).
	// Nil means always ready.
	Ready func() bool
	// MaxBody bounds a request body (default DefaultMaxBody).
	MaxBody int64
	// CacheMaxAge is sent to VerneMQ as cache-control: max-age on allowed answers (0: none,
	// VerneMQ then asks every time). Brokers that cache by their own configuration (EMQX's
	// authorization cache, go-auth's auth_cache_seconds/acl_cache_seconds) ignore it.
	CacheMaxAge time.Duration
	// Log receives one line per malformed request (V(1)).
	Log logr.Logger
}

// Counters are the handler's totals since it started.
type Counters struct {
	Allowed, Denied, Malformed, NotReady uint64
}

// Handler is the decision endpoint (an http.Handler). Routes, all POST:
//
//	/emqx/authn                   EMQX 5 HTTP authentication
//	/emqx/authz                   EMQX 5 HTTP authorization
//	/vernemq/{hook}               VerneMQ webhooks (or any path with the vernemq-hook header)
//	/mosquitto-go-auth/user       go-auth HTTP backend: http_getuser_uri
//	/mosquitto-go-auth/superuser  http_superuser_uri
//	/mosquitto-go-auth/acl        http_aclcheck_uri
type Handler struct {
	cfg                                  Config
	allowed, denied, malformed, notReady atomic.Uint64
}

// NewHandler returns the decision endpoint over cfg.Decider.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Decider == nil {
		return nil, errors.New("decision: a Decider is required")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	return &Handler{cfg: cfg}, nil
}

// Counters returns the totals so far.
func (h *Handler) Counters() Counters {
	return Counters{Allowed: h.allowed.Load(), Denied: h.denied.Load(), Malformed: h.malformed.Load(), NotReady: h.notReady.Load()}
}

// Path prefixes of the three protocols.
const (
	EMQXPrefix    = "/emqx/"
	VerneMQPrefix = "/vernemq/"
	GoAuthPrefix  = "/mosquitto-go-auth/"
)

// requestError is a malformed request: answered 4xx with its text.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, r, &requestError{status: http.StatusMethodNotAllowed, msg: "only POST"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxBody)
	var err error
	switch p := r.URL.Path; {
	case p == EMQXPrefix+"authn":
		err = h.emqxAuthn(w, r)
	case p == EMQXPrefix+"authz":
		err = h.emqxAuthz(w, r)
	case strings.HasPrefix(p, VerneMQPrefix) || r.Header.Get("vernemq-hook") != "":
		hook := r.Header.Get("vernemq-hook")
		if hook == "" {
			hook = strings.TrimPrefix(p, VerneMQPrefix)
		}
		err = h.verneMQ(w, r, hook)
	case strings.HasPrefix(p, GoAuthPrefix):
		err = h.goAuth(w, r, strings.TrimPrefix(p, GoAuthPrefix))
	default:
		err = &requestError{status: http.StatusNotFound, msg: "no decision endpoint at " + p}
	}
	if err != nil {
		h.fail(w, r, err)
	}
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.malformed.Add(1)
	status := http.StatusBadRequest
	var re *requestError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		status = http.StatusRequestEntityTooLarge
	case errors.As(err, &re):
		status = re.status
	}
	h.cfg.Log.V(1).Info("malformed decision request", "path", r.URL.Path, "status", status, "error", err.Error())
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func (h *Handler) ready() bool {
	if h.cfg.Ready == nil || h.cfg.Ready() {
		return true
	}
	h.notReady.Add(1)
	return false
}

func (h *Handler) count(allow bool) bool {
	if allow {
		h.allowed.Add(1)
	} else {
		h.denied.Add(1)
	}
	return allow
}

// allows is the table's decision for one message; an empty username is never allowed (the
// table has no anonymous group).
func (h *Handler) allows(username string, access acl.Access, topic string) bool {
	if username == "" || topic == "" {
		return false
	}
	return h.cfg.Decider.Allows(username, access, topic)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads one JSON object into v; unknown fields are allowed (every broker sends
// more than the decision needs), a missing or non-JSON body is malformed.
func decodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return &requestError{status: http.StatusUnsupportedMediaType, msg: "content type " + ct + ", want application/json"}
		}
	}
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return err
		}
		return badRequest("decode JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("decode JSON body: trailing data after the object")
	}
	return nil
}

// --- EMQX 5 ---------------------------------------------------------------------------------

// emqxAuthnRequest is the body EMQX sends with the template of docs/scale.md
// ({"username": "${username}", "password": "${password}", "clientid": "${clientid}"}).
type emqxAuthnRequest struct {
	Username *string `json:"username"`
	Password *string `json:"password"`
	ClientID *string `json:"clientid"`
}

type emqxResult struct {
	Result      string `json:"result"`
	IsSuperuser bool   `json:"is_superuser,omitempty"`
}

func allowDeny(ok bool) string {
	if ok {
		return "allow"
	}
	return "deny"
}

func (h *Handler) emqxAuthn(w http.ResponseWriter, r *http.Request) error {
	var req emqxAuthnRequest
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	if req.Username == nil || req.Password == nil || req.ClientID == nil {
		return badRequest("EMQX authn body needs username, password and clientid")
	}
	if !h.ready() {
		writeJSON(w, http.StatusOK, emqxResult{Result: "deny"})
		return nil
	}
	ok := h.count(*req.Username != "" && h.cfg.Decider.Authenticate(*req.Username, *req.Password, *req.ClientID))
	// is_superuser stays false even for the table's admin: EMQX would then skip authorization
	// for it, while the table answers every check for it anyway.
	writeJSON(w, http.StatusOK, emqxResult{Result: allowDeny(ok)})
	return nil
}

// emqxAuthzRequest is the body EMQX sends with the template of docs/scale.md
// ({"username": "${username}", "clientid": "${clientid}", "topic": "${topic}", "action": "${action}"}).
type emqxAuthzRequest struct {
	Username *string `json:"username"`
	ClientID string  `json:"clientid"`
	Topic    string  `json:"topic"`
	Action   string  `json:"action"`
}

func (h *Handler) emqxAuthz(w http.ResponseWriter, r *http.Request) error {
	var req emqxAuthzRequest
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	if req.Username == nil || req.Topic == "" {
		return badRequest("EMQX authz body needs username and topic")
	}
	var ok bool
	switch req.Action {
	case "publish":
		ok = h.ready() && h.allows(*req.Username, acl.Publish, req.Topic)
	case "subscribe":
		ok = h.ready() && h.allows(*req.Username, acl.Subscribe, req.Topic)
	case "all":
		ok = h.ready() && h.allows(*req.Username, acl.Publish, req.Topic) && h.allows(*req.Username, acl.Subscribe, req.Topic)
	default:
		return badRequest("EMQX authz action %q, want publish or subscribe", req.Action)
	}
	writeJSON(w, http.StatusOK, emqxResult{Result: allowDeny(h.count(ok))})
	return nil
}

// --- VerneMQ --------------------------------------------------------------------------------

type verneTopic struct {
	Topic string `json:"topic"`
	QoS   int    `json:"qos"`
}

// verneRequest covers the three hooks' bodies (and their _m5 forms); each hook reads its own
// fields.
type verneRequest struct {
	Username *string      `json:"username"`
	Password *string      `json:"password"`
	ClientID *string      `json:"client_id"`
	Topic    *string      `json:"topic"`
	Topics   []verneTopic `json:"topics"`
}

// rejectedQoS is the QoS VerneMQ's auth_on_subscribe modifiers use for a refused filter
// (SUBACK 0x80, 0x87 in MQTT v5).
const rejectedQoS = 128

func (h *Handler) verneMQ(w http.ResponseWriter, r *http.Request, hook string) error {
	var req verneRequest
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	username := ""
	if req.Username != nil {
		username = *req.Username
	}
	switch strings.TrimSuffix(hook, "_m5") {
	case "auth_on_register":
		if req.ClientID == nil {
			return badRequest("auth_on_register body needs client_id")
		}
		password := ""
		if req.Password != nil {
			password = *req.Password
		}
		if !h.ready() {
			return h.verneNotReady(w)
		}
		h.verneAnswer(w, h.count(username != "" && h.cfg.Decider.Authenticate(username, password, *req.ClientID)), nil)
	case "auth_on_publish":
		if req.Topic == nil {
			return badRequest("auth_on_publish body needs topic")
		}
		if !h.ready() {
			return h.verneNotReady(w)
		}
		h.verneAnswer(w, h.count(h.allows(username, acl.Publish, *req.Topic)), nil)
	case "auth_on_subscribe":
		if len(req.Topics) == 0 {
			return badRequest("auth_on_subscribe body needs topics")
		}
		if !h.ready() {
			return h.verneNotReady(w)
		}
		h.verneSubscribe(w, username, req.Topics)
	default:
		return &requestError{status: http.StatusNotFound, msg: fmt.Sprintf("VerneMQ hook %q is not served (auth_on_register, auth_on_publish, auth_on_subscribe and their _m5 forms are)", hook)}
	}
	return nil
}

// verneSubscribe grants the filters the table allows and rejects the others through the
// topics modifier (QoS 128), so one refused filter does not refuse the whole SUBSCRIBE, as on
// Mosquitto.
func (h *Handler) verneSubscribe(w http.ResponseWriter, username string, topics []verneTopic) {
	out := make([]verneTopic, len(topics))
	anyDenied, anyAllowed := false, false
	for i, t := range topics {
		out[i] = t
		if h.count(h.allows(username, acl.Subscribe, t.Topic)) {
			anyAllowed = true
		} else {
			out[i].QoS = rejectedQoS
			anyDenied = true
		}
	}
	switch {
	case !anyAllowed:
		h.verneAnswer(w, false, nil)
	case anyDenied:
		h.verneAnswer(w, true, out)
	default:
		h.verneAnswer(w, true, nil)
	}
}

func (h *Handler) verneAnswer(w http.ResponseWriter, ok bool, topics []verneTopic) {
	if !ok {
		writeJSON(w, http.StatusOK, map[string]any{"result": map[string]string{"error": "not_allowed"}})
		return
	}
	if h.cfg.CacheMaxAge > 0 {
		w.Header().Set("Cache-Control", "max-age="+strconv.Itoa(int(h.cfg.CacheMaxAge/time.Second)))
	}
	if topics != nil {
		writeJSON(w, http.StatusOK, map[string]any{"result": "ok", "topics": topics})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"result": "ok"})
}

func (h *Handler) verneNotReady(w http.ResponseWriter) error {
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"result": map[string]string{"error": "decision table not synced yet"}})
	return nil
}

// --- mosquitto-go-auth ----------------------------------------------------------------------

// go-auth's acc values: Mosquitto's MOSQ_ACL_* (readwrite is go-auth's own, for its files).
const (
	GoAuthRead        = 1
	GoAuthWrite       = 2
	GoAuthReadWrite   = 3
	GoAuthSubscribe   = 4
	GoAuthUnsubscribe = 8
)

// goAuthParams are the fields go-auth sends (JSON with http_params_mode json, the default, or
// a form with http_params_mode form).
type goAuthParams struct {
	Username *string `json:"username"`
	Password *string `json:"password"`
	ClientID *string `json:"clientid"`
	Topic    *string `json:"topic"`
	Acc      *int    `json:"acc"`
}

func formParams(r *http.Request) (goAuthParams, error) {
	if err := r.ParseForm(); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return goAuthParams{}, err
		}
		return goAuthParams{}, badRequest("parse form: %v", err)
	}
	var p goAuthParams
	get := func(v url.Values, k string) *string {
		if _, ok := v[k]; !ok {
			return nil
		}
		s := v.Get(k)
		return &s
	}
	p.Username, p.Password, p.ClientID, p.Topic = get(r.PostForm, "username"), get(r.PostForm, "password"), get(r.PostForm, "clientid"), get(r.PostForm, "topic")
	if s := get(r.PostForm, "acc"); s != nil {
		n, err := strconv.Atoi(*s)
		if err != nil {
			return goAuthParams{}, badRequest("acc %q is not a number", *s)
		}
		p.Acc = &n
	}
	return p, nil
}

func (h *Handler) goAuth(w http.ResponseWriter, r *http.Request, what string) error {
	var p goAuthParams
	var err error
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/x-www-form-urlencoded" {
		p, err = formParams(r)
	} else {
		err = decodeJSON(r, &p)
	}
	if err != nil {
		return err
	}
	if p.Username == nil {
		return badRequest("go-auth %s needs username", what)
	}
	var decide func() bool
	switch what {
	case "user":
		if p.Password == nil || p.ClientID == nil {
			return badRequest("go-auth user needs password and clientid")
		}
		decide = func() bool {
			return *p.Username != "" && h.cfg.Decider.Authenticate(*p.Username, *p.Password, *p.ClientID)
		}
	case "superuser":
		decide = func() bool { return h.cfg.Decider.IsAdmin(*p.Username) }
	case "acl":
		if p.Topic == nil || p.Acc == nil {
			return badRequest("go-auth acl needs topic and acc")
		}
		accesses, err := goAuthAccesses(*p.Acc)
		if err != nil {
			return err
		}
		decide = func() bool {
			for _, a := range accesses {
				if !h.allows(*p.Username, a, *p.Topic) {
					return false
				}
			}
			return true
		}
	default:
		return &requestError{status: http.StatusNotFound, msg: "go-auth endpoint " + what + " is not served (user, superuser, acl are)"}
	}
	if !h.ready() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "error": "decision table not synced yet"})
		return nil
	}
	h.goAuthAnswer(w, r, h.count(decide()))
	return nil
}

func goAuthAccesses(acc int) ([]acl.Access, error) {
	switch acc {
	case GoAuthRead:
		return []acl.Access{acl.Receive}, nil
	case GoAuthWrite:
		return []acl.Access{acl.Publish}, nil
	case GoAuthReadWrite:
		return []acl.Access{acl.Receive, acl.Publish}, nil
	case GoAuthSubscribe:
		return []acl.Access{acl.Subscribe}, nil
	case GoAuthUnsubscribe:
		return []acl.Access{acl.Unsubscribe}, nil
	}
	return nil, badRequest("go-auth acc %d, want 1 (read), 2 (write), 3 (readwrite), 4 (subscribe) or 8 (unsubscribe)", acc)
}

// goAuthAnswer answers in a way every http_response_mode reads the same: status 200 and
// {"ok": true} for an allow (status mode reads the code, json mode the body), 403 and
// {"ok": false} for a deny (a 4xx is a plain deny in every mode, not an error to retry).
// response_mode=text in the query (set it in the configured URI) answers an allow with the
// body "ok", which text mode requires.
func (h *Handler) goAuthAnswer(w http.ResponseWriter, r *http.Request, ok bool) {
	if !ok {
		writeJSON(w, http.StatusForbidden, map[string]any{"ok": false, "error": "not allowed"})
		return
	}
	if r.URL.Query().Get("response_mode") == "text" {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "error": ""})
}
