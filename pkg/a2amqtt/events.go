package a2amqtt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// streamEvent is the wire shape of a2a-go's a2a.StreamResponse (its unexported wrapper: exactly
// one of message, task, statusUpdate, artifactUpdate, each an a2a-go type with a2a-go's JSON).
// a2a.StreamResponse's MarshalJSON/UnmarshalJSON go through that wrapper with a nested
// json.Marshal/Unmarshal, so encoding/json validates and copies the event once more around
// them; every reply is one of these, so the SDK encodes and decodes the wrapper directly. Same
// bytes (TestGoldenWire, TestStreamEventMatchesA2AGo), same a2a-go types.
type streamEvent struct {
	Message        *a2a.Message                 `json:"message,omitempty"`
	Task           *a2a.Task                    `json:"task,omitempty"`
	StatusUpdate   *a2a.TaskStatusUpdateEvent   `json:"statusUpdate,omitempty"`
	ArtifactUpdate *a2a.TaskArtifactUpdateEvent `json:"artifactUpdate,omitempty"`
}

// wrapEvent is what a2a.StreamResponse{Event: ev}.MarshalJSON encodes.
func wrapEvent(ev a2a.Event) (*streamEvent, error) {
	switch v := ev.(type) {
	case *a2a.Message:
		return &streamEvent{Message: v}, nil
	case *a2a.Task:
		return &streamEvent{Task: v}, nil
	case *a2a.TaskStatusUpdateEvent:
		return &streamEvent{StatusUpdate: v}, nil
	case *a2a.TaskArtifactUpdateEvent:
		return &streamEvent{ArtifactUpdate: v}, nil
	}
	return nil, fmt.Errorf("unknown event type: %T", ev)
}

// event is what a2a.StreamResponse.UnmarshalJSON accepts: exactly one event.
func (w *streamEvent) event() (a2a.Event, error) {
	var ev a2a.Event
	n := 0
	if w.Message != nil {
		ev, n = w.Message, n+1
	}
	if w.Task != nil {
		ev, n = w.Task, n+1
	}
	if w.StatusUpdate != nil {
		ev, n = w.StatusUpdate, n+1
	}
	if w.ArtifactUpdate != nil {
		ev, n = w.ArtifactUpdate, n+1
	}
	switch n {
	case 0:
		return nil, fmt.Errorf("unknown event type: expected one of message, task, statusUpdate, artifactUpdate")
	case 1:
		return ev, nil
	}
	return nil, fmt.Errorf("expected exactly one event type, got %d", n)
}

// decodeStreamReply decodes a stream item reply ({"result": <StreamResponse>} or {"error": ...}):
// the event, or the JSON-RPC error it carries, or why it is not one (err). It accepts and
// refuses exactly what decoding into a2a.StreamResponse does (FuzzDecodeStreamReply): the
// direct decode is taken only when it succeeds on a payload whose top-level "result" key
// appears at most once (a repeated key merges into streamEvent where a2a-go's UnmarshalJSON
// would start afresh); anything else goes through a2a-go's decoder for its verdict and error.
func decodeStreamReply(payload []byte) (ev a2a.Event, rpcErr *RPCError, err error) {
	if n, ok := topLevelKeyCount(payload, "result"); ok && n <= 1 {
		var env struct {
			Result *streamEvent `json:"result"`
			Error  *RPCError    `json:"error"`
		}
		if json.Unmarshal(payload, &env) == nil {
			if env.Result == nil {
				return nil, env.Error, nil
			}
			if ev, err := env.Result.event(); err == nil {
				return ev, env.Error, nil
			}
		}
	}
	return decodeStreamReplyA2A(payload)
}

// DecodeResponse decodes a JSON-RPC response whose result is an A2A event (a SendMessage
// result, or an event of a stream) as the requester decodes a reply: in one pass, where a2a-go's
// a2a.StreamResponse takes two, accepting and refusing what that decoder does. A JSON-RPC
// error comes back as *RPCError. For a reader of such responses from another transport (an SSE
// stream's data lines, an HTTP body).
func DecodeResponse(payload []byte) (a2a.Event, error) {
	ev, rpcErr, err := decodeStreamReply(payload)
	switch {
	case err != nil:
		return nil, fmt.Errorf("a2amqtt: decode response: %w", err)
	case rpcErr != nil:
		return nil, rpcErr
	case ev == nil:
		return nil, errors.New("a2amqtt: response has neither result nor error")
	}
	return ev, nil
}

// decodeStreamReplyA2A is decodeStreamReply through a2a-go's a2a.StreamResponse.
func decodeStreamReplyA2A(payload []byte) (a2a.Event, *RPCError, error) {
	var env struct {
		Result *a2a.StreamResponse `json:"result"`
		Error  *RPCError           `json:"error"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return nil, nil, err
	}
	var ev a2a.Event
	if env.Result != nil {
		ev = env.Result.Event
	}
	return ev, env.Error, nil
}

// topLevelKeyCount counts the keys of payload's top-level object that encoding/json matches to
// key (an ASCII name; it matches case-insensitively). ok is false when a key cannot be judged
// without unescaping (escapes, non-ASCII) or payload is not an object. It is a cheap guard for
// the one-pass decoders: call it on payloads encoding/json has accepted or will check anyway.
func topLevelKeyCount(payload []byte, key string) (n int, ok bool) {
	p := bytes.TrimSpace(payload)
	if len(p) == 0 || p[0] != '{' {
		return 0, false
	}
	depth, expectKey := 0, false
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '{':
			depth++
			expectKey = depth == 1
		case '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		case '"':
			j, plain := i+1, true
			for ; j < len(p) && p[j] != '"'; j++ {
				switch {
				case p[j] == '\\':
					plain = false
					j++
				case p[j] >= utf8.RuneSelf:
					plain = false
				}
			}
			if j >= len(p) {
				return 0, false
			}
			if depth == 1 && expectKey {
				if !plain {
					return 0, false
				}
				if bytes.EqualFold(p[i+1:j], []byte(key)) {
					n++
				}
				expectKey = false
			}
			i = j
		}
	}
	return n, true
}
