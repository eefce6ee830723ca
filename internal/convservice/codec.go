package convservice

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// route is what the service needs to relay an agent's reply: which agent and
// task it belongs to, and the requester's reply path. It travels inside the
// Correlation Data of the forwarded request, encrypted and authenticated
// (AES-256-GCM), so a reply can be routed by any replica without a lookup,
// and the agent, which sees the sealed bytes, can neither read the
// requester's Response Topic and Correlation Data (it could otherwise answer
// the requester directly, bypassing the rules) nor forge a route (gated
// agents all share the service's reply topics, so the seal is what keeps
// agent A from answering agent B's requesters).
type route struct {
	Agent         string // "org/unit/agent"
	TaskID        string
	ContextID     string
	Method        conversation.Method
	Correlation   []byte // the requester's
	ResponseTopic string // the requester's
	// Internal marks requests the service itself sent (CancelTask after an
	// input-required timeout): their replies are observed, not relayed.
	Internal bool
	// Retry marks the forward of a repeated message (conversation.KindRetry): the task may have
	// finished already, so its reply is judged a replay only by this route's own end (replay.go).
	Retry bool
}

// Route flags, the sealed body's first byte.
const (
	routeInternal byte = 1 << iota
	routeRetry
)

const (
	// routeVersion 2: AES-256-GCM. Version 1 (HMAC only, readable) is
	// refused: an agent could read the requester's reply path from it.
	routeVersion = 2
	nonceLen     = 12
)

var errBadRoute = errors.New("correlation data is not a sealed conversation-service route")

// sealer seals routes with the current key and opens them with the current
// key or any previous one (key rotation: every replica gets the new secret
// as current and the old one as previous, then the old one is dropped once
// no forwarded request can still be answered, i.e. after the longest task).
type sealer struct {
	current cipher.AEAD
	all     []cipher.AEAD // current first
}

// routeKey derives the 256-bit AEAD key from a secret, so the broker
// password (the default secret) is never used as a key as is.
func routeKey(secret []byte) []byte {
	m := hmac.New(sha256.New, []byte("a2a-fleet conversation-service route v2"))
	m.Write(secret)
	return m.Sum(nil)
}

func newAEAD(secret []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(routeKey(secret))
	if err != nil {
		return nil, fmt.Errorf("route cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("route cipher: %w", err)
	}
	return aead, nil
}

func newSealer(current []byte, previous ...[]byte) (*sealer, error) {
	s := &sealer{}
	for i, secret := range append([][]byte{current}, previous...) {
		if len(secret) == 0 {
			if i == 0 {
				return nil, errors.New("route secret is empty")
			}
			continue
		}
		a, err := newAEAD(secret)
		if err != nil {
			return nil, err
		}
		s.all = append(s.all, a)
	}
	s.current = s.all[0]
	return s, nil
}

func appendField(b, f []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

var routeAAD = []byte{routeVersion}

func (s *sealer) seal(r route) []byte {
	plain := make([]byte, 0, 16+len(r.Agent)+len(r.TaskID)+len(r.ContextID)+len(r.Method)+len(r.Correlation)+len(r.ResponseTopic))
	flags := byte(0)
	if r.Internal {
		flags |= routeInternal
	}
	if r.Retry {
		flags |= routeRetry
	}
	plain = append(plain, flags)
	plain = appendField(plain, []byte(r.Agent))
	plain = appendField(plain, []byte(r.TaskID))
	plain = appendField(plain, []byte(r.ContextID))
	plain = appendField(plain, []byte(r.Method))
	plain = appendField(plain, r.Correlation)
	plain = appendField(plain, []byte(r.ResponseTopic))
	out := make([]byte, 1+nonceLen, 1+nonceLen+len(plain)+s.current.Overhead())
	out[0] = routeVersion
	if _, err := rand.Read(out[1 : 1+nonceLen]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // never returns an error (Go 1.24+)
	}
	return s.current.Seal(out, out[1:1+nonceLen], plain, routeAAD)
}

func (s *sealer) open(b []byte) (route, error) {
	if len(b) < 1+nonceLen+16 || b[0] != routeVersion {
		return route{}, errBadRoute
	}
	nonce, sealed := b[1:1+nonceLen], b[1+nonceLen:]
	var body []byte
	var err error
	for _, a := range s.all {
		if body, err = a.Open(nil, nonce, sealed, routeAAD); err == nil {
			break
		}
	}
	if err != nil || len(body) < 1 {
		return route{}, errBadRoute
	}
	r := route{Internal: body[0]&routeInternal != 0, Retry: body[0]&routeRetry != 0}
	rest := body[1:]
	fields := make([][]byte, 6)
	for i := range fields {
		n, k := binary.Uvarint(rest)
		if k <= 0 || uint64(len(rest)-k) < n {
			return route{}, errBadRoute
		}
		fields[i] = rest[k : k+int(n)]
		rest = rest[k+int(n):]
	}
	r.Agent, r.TaskID, r.ContextID = string(fields[0]), string(fields[1]), string(fields[2])
	r.Method = conversation.Method(fields[3])
	r.Correlation = fields[4]
	r.ResponseTopic = string(fields[5])
	return r, nil
}

// parsedReply is what the relay needs of one JSON-RPC reply of an agent,
// read in one pass over the payload.
type parsedReply struct {
	// ev is the engine's event (empty Kind: nothing the engine tracks,
	// e.g. a ListTasks result). Its TaskID and ContextID are the ids the
	// payload names (the agent's).
	ev conversation.Event
	// isTask: the result is a Task object (the first item of a core A2A
	// stream, a unary result, a GetTask/CancelTask answer).
	isTask bool
	// v03: the reply uses A2A v0.3 shapes ("kind" discriminators).
	v03 bool
	// statusMessage is the status message of a status update or task (nil
	// when none).
	statusMessage json.RawMessage
	// errCode and errKind (error.data.a2a_error of binding errors) for
	// error replies.
	errCode int
	errKind string
}

// item describes the reply for a2amqtt.EndsReplies (first: the route's first reply).
func (pr parsedReply) item(first bool) a2amqtt.ReplyItem {
	it := a2amqtt.ReplyItem{State: pr.ev.State, Final: pr.ev.Final, First: first}
	switch pr.ev.Kind {
	case conversation.EventStatus:
		it.Kind = a2amqtt.ReplyStatusUpdate
	case conversation.EventArtifact:
		it.Kind = a2amqtt.ReplyArtifactUpdate
	case conversation.EventTask:
		it.Kind = a2amqtt.ReplyTask
	case conversation.EventMessage:
		it.Kind = a2amqtt.ReplyMessage
	case conversation.EventError:
		it.Kind = a2amqtt.ReplyError
	}
	return it
}

// parseReply classifies one JSON-RPC reply of an agent for the engine. It
// understands A2A v1.0 (ProtoJSON, stream items wrapped as statusUpdate /
// artifactUpdate, SendMessage results as task / message) and v0.3 ("kind"
// discriminators), and only reads what the relay needs.
func parseReply(payload []byte) (parsedReply, error) {
	type status struct {
		State   string          `json:"state"`
		Message json.RawMessage `json:"message"`
	}
	type obj struct {
		Kind      string  `json:"kind"`
		ID        string  `json:"id"`
		TaskID    string  `json:"taskId"`
		ContextID string  `json:"contextId"`
		Status    *status `json:"status"`
		Role      string  `json:"role"`
		Final     bool    `json:"final"`
	}
	type result struct {
		obj
		StatusUpdate   *obj `json:"statusUpdate"`
		ArtifactUpdate *obj `json:"artifactUpdate"`
		Task           *obj `json:"task"`
		Message        *obj `json:"message"`
	}
	// One pass over the payload (the relay path decodes every reply).
	var env struct {
		Result *result `json:"result"`
		Error  *struct {
			Code int `json:"code"`
			Data json.RawMessage
		} `json:"error"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return parsedReply{}, fmt.Errorf("decode agent reply: %w", err)
	}
	if e := env.Error; e != nil {
		pr := parsedReply{ev: conversation.Event{Kind: conversation.EventError}, errCode: e.Code}
		var data struct {
			A2AError string `json:"a2a_error"`
		}
		if len(e.Data) > 0 && e.Data[0] == '{' && json.Unmarshal(e.Data, &data) == nil {
			pr.errKind = data.A2AError
		}
		return pr, nil
	}
	if env.Result == nil {
		return parsedReply{}, errors.New("agent reply has neither result nor error")
	}
	res := env.Result
	state := func(o *obj) a2a.TaskState {
		if o.Status == nil {
			return a2a.TaskStateUnspecified
		}
		return conversation.ParseState(o.Status.State)
	}
	statusMessage := func(o *obj) json.RawMessage {
		if o.Status == nil || len(o.Status.Message) == 0 || string(o.Status.Message) == "null" {
			return nil
		}
		return o.Status.Message
	}
	status1 := func(o *obj, v03 bool) parsedReply {
		return parsedReply{ev: conversation.Event{Kind: conversation.EventStatus, TaskID: o.TaskID, ContextID: o.ContextID, State: state(o), Final: o.Final},
			statusMessage: statusMessage(o), v03: v03}
	}
	task := func(o *obj, v03 bool) parsedReply {
		return parsedReply{ev: conversation.Event{Kind: conversation.EventTask, TaskID: o.ID, ContextID: o.ContextID, State: state(o)},
			isTask: true, statusMessage: statusMessage(o), v03: v03}
	}
	switch {
	case res.StatusUpdate != nil:
		return status1(res.StatusUpdate, false), nil
	case res.ArtifactUpdate != nil:
		o := res.ArtifactUpdate
		return parsedReply{ev: conversation.Event{Kind: conversation.EventArtifact, TaskID: o.TaskID, ContextID: o.ContextID}}, nil
	case res.Task != nil:
		return task(res.Task, false), nil
	case res.Message != nil:
		o := res.Message
		return parsedReply{ev: conversation.Event{Kind: conversation.EventMessage, TaskID: o.TaskID, ContextID: o.ContextID}}, nil
	}
	o := &res.obj
	switch o.Kind {
	case "status-update":
		return status1(o, true), nil
	case "artifact-update":
		return parsedReply{ev: conversation.Event{Kind: conversation.EventArtifact, TaskID: o.TaskID, ContextID: o.ContextID}, v03: true}, nil
	case "message":
		return parsedReply{ev: conversation.Event{Kind: conversation.EventMessage, TaskID: o.TaskID, ContextID: o.ContextID}, v03: true}, nil
	case "task":
		return task(o, true), nil
	}
	if o.ID != "" && o.Status != nil {
		// A bare Task (GetTask / CancelTask result).
		return task(o, false), nil
	}
	// ListTasks results and the like carry no single task state.
	return parsedReply{}, nil
}

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      any             `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcerr.Error   `json:"error,omitempty"`
}

func encodeResponse(id any, result any, e *rpcerr.Error) ([]byte, error) {
	resp := rpcResponse{JSONRPC: "2.0", ID: id, Error: e}
	if e == nil {
		b, err := json.Marshal(result)
		if err != nil {
			return nil, fmt.Errorf("encode result: %w", err)
		}
		resp.Result = b
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return nil, fmt.Errorf("encode JSON-RPC response: %w", err)
	}
	return b, nil
}

// assignIDs writes params.message.taskId and contextId into a send request's
// payload (A2A v0.3 requesters may omit them; the service assigns them so
// the rules, which key on ids, apply and the agent receives a request in the
// profile's shape). Every other byte of the request is kept.
func assignIDs(payload []byte, taskID, contextID string) ([]byte, error) {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(payload, &env); err != nil {
		return nil, fmt.Errorf("assign ids: %w", err)
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(env["params"], &params); err != nil {
		return nil, fmt.Errorf("assign ids: params: %w", err)
	}
	var msg map[string]json.RawMessage
	if err := json.Unmarshal(params["message"], &msg); err != nil {
		return nil, fmt.Errorf("assign ids: params.message: %w", err)
	}
	for k, v := range map[string]string{"taskId": taskID, "contextId": contextID} {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		msg[k] = b
	}
	var err error
	if params["message"], err = json.Marshal(msg); err != nil {
		return nil, err
	}
	if env["params"], err = json.Marshal(params); err != nil {
		return nil, err
	}
	return json.Marshal(env)
}
