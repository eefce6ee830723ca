package convservice

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// route is what the service needs to relay an agent's reply: which agent and
// task it belongs to, and the requester's reply path. It travels inside the
// Correlation Data of the forwarded request (sealed with an HMAC), so a
// reply can be routed by any restart of this replica without a lookup, and
// the agent, which sees it, can neither read another requester's path into
// its replies nor forge one (gated agents all share the service's reply
// topics, so the seal is what keeps agent A from answering agent B's
// requesters).
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
}

const (
	routeVersion = 1
	macLen       = 16
)

var errBadRoute = errors.New("correlation data is not a sealed conversation-service route")

// sealer seals and opens routes with one HMAC key shared by all replicas.
type sealer struct{ key []byte }

func newSealer(secret []byte) sealer {
	// Derive rather than use the secret directly, so the broker password
	// (the default secret) is never used as a MAC key as is.
	m := hmac.New(sha256.New, []byte("a2a-fleet conversation-service route v1"))
	m.Write(secret)
	return sealer{key: m.Sum(nil)}
}

func appendField(b, f []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

func (s sealer) seal(r route) []byte {
	b := make([]byte, 0, 64+len(r.Agent)+len(r.TaskID)+len(r.ContextID)+len(r.Correlation)+len(r.ResponseTopic))
	b = append(b, routeVersion)
	flags := byte(0)
	if r.Internal {
		flags = 1
	}
	b = append(b, flags)
	b = appendField(b, []byte(r.Agent))
	b = appendField(b, []byte(r.TaskID))
	b = appendField(b, []byte(r.ContextID))
	b = appendField(b, []byte(r.Method))
	b = appendField(b, r.Correlation)
	b = appendField(b, []byte(r.ResponseTopic))
	m := hmac.New(sha256.New, s.key)
	m.Write(b)
	return m.Sum(b)[:len(b)+macLen]
}

func (s sealer) open(b []byte) (route, error) {
	if len(b) < 2+macLen || b[0] != routeVersion {
		return route{}, errBadRoute
	}
	body, mac := b[:len(b)-macLen], b[len(b)-macLen:]
	m := hmac.New(sha256.New, s.key)
	m.Write(body)
	if !hmac.Equal(m.Sum(nil)[:macLen], mac) {
		return route{}, errBadRoute
	}
	r := route{Internal: body[1]&1 != 0}
	rest := body[2:]
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
	r.Correlation = bytes.Clone(fields[4])
	r.ResponseTopic = string(fields[5])
	return r, nil
}

// replyEvent classifies one JSON-RPC reply of an agent for the engine. It
// understands A2A v1.0 (ProtoJSON, stream items wrapped as statusUpdate /
// artifactUpdate, SendMessage results as task / message) and v0.3 ("kind"
// discriminators), and only reads what the engine needs.
func replyEvent(payload []byte) (conversation.Event, error) {
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return conversation.Event{}, fmt.Errorf("decode agent reply: %w", err)
	}
	if env.Error != nil {
		return conversation.Event{Kind: conversation.EventError}, nil
	}
	if len(env.Result) == 0 {
		return conversation.Event{}, errors.New("agent reply has neither result nor error")
	}
	type status struct {
		State string `json:"state"`
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
	var res struct {
		obj
		StatusUpdate   *obj `json:"statusUpdate"`
		ArtifactUpdate *obj `json:"artifactUpdate"`
		Task           *obj `json:"task"`
		Message        *obj `json:"message"`
	}
	if err := json.Unmarshal(env.Result, &res); err != nil {
		return conversation.Event{}, fmt.Errorf("decode agent reply result: %w", err)
	}
	state := func(o *obj) a2a.TaskState {
		if o.Status == nil {
			return a2a.TaskStateUnspecified
		}
		return conversation.ParseState(o.Status.State)
	}
	switch {
	case res.StatusUpdate != nil:
		o := res.StatusUpdate
		return conversation.Event{Kind: conversation.EventStatus, TaskID: o.TaskID, ContextID: o.ContextID, State: state(o), Final: o.Final}, nil
	case res.ArtifactUpdate != nil:
		o := res.ArtifactUpdate
		return conversation.Event{Kind: conversation.EventArtifact, TaskID: o.TaskID, ContextID: o.ContextID}, nil
	case res.Task != nil:
		o := res.Task
		return conversation.Event{Kind: conversation.EventTask, TaskID: o.ID, ContextID: o.ContextID, State: state(o)}, nil
	case res.Message != nil:
		o := res.Message
		return conversation.Event{Kind: conversation.EventMessage, TaskID: o.TaskID, ContextID: o.ContextID}, nil
	}
	o := &res.obj
	switch o.Kind {
	case "status-update":
		return conversation.Event{Kind: conversation.EventStatus, TaskID: o.TaskID, ContextID: o.ContextID, State: state(o), Final: o.Final}, nil
	case "artifact-update":
		return conversation.Event{Kind: conversation.EventArtifact, TaskID: o.TaskID, ContextID: o.ContextID}, nil
	case "message":
		return conversation.Event{Kind: conversation.EventMessage, TaskID: o.TaskID, ContextID: o.ContextID}, nil
	case "task":
		return conversation.Event{Kind: conversation.EventTask, TaskID: o.ID, ContextID: o.ContextID, State: state(o)}, nil
	}
	if o.ID != "" && o.Status != nil {
		// A bare Task (GetTask / CancelTask result).
		return conversation.Event{Kind: conversation.EventTask, TaskID: o.ID, ContextID: o.ContextID, State: state(o)}, nil
	}
	// ListTasks results and the like carry no single task state.
	return conversation.Event{}, nil
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      any             `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

func encodeResponse(id any, result any, e *rpcError) ([]byte, error) {
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
