package a2amqtt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
)

// SendMessageJSON is SendMessage with the result as JSON: an a2a.StreamResponse ({"task": …} or
// {"message": …}), which is also the result member of a JSON-RPC SendMessage response over HTTP.
// A reply of one Task or Message (what an agent answers SendMessage with) is handed on as the
// agent encoded it, neither decoded nor encoded again: the HTTP gateway's hot path. A reply of
// several events (an agent that streams for the unary method) is decoded and folded as
// SendMessage folds it, then encoded.
func (t *Transport) SendMessageJSON(ctx context.Context, params a2aclient.ServiceParams, req *a2a.SendMessageRequest) (json.RawMessage, error) {
	req, err := prepareSend(req)
	if err != nil {
		return nil, err
	}
	c := t.sendCall(MethodSendMessage, req, false)
	c.events = false // decodeReply keeps the result raw
	var raw json.RawMessage
	fold := sendMessageFold{req: req, first: true}
	err = t.r.doParams(ctx, c, params, func(rep *reply) (bool, error) {
		if len(rep.resp.Result) == 0 {
			return false, fmt.Errorf("a2amqtt: reply to %s has neither result nor error", c.method)
		}
		if fold.first && isSingleResult(rep.resp.Result) {
			raw = rep.resp.Result
			return true, nil
		}
		ev, rpcErr, err := decodeStreamReply(resultEnvelope(rep.resp.Result))
		switch {
		case err != nil:
			return false, fmt.Errorf("a2amqtt: reply to %s is not an A2A stream response: %w", c.method, err)
		case rpcErr != nil:
			return false, rpcErr
		case ev == nil:
			return false, fmt.Errorf("a2amqtt: reply to %s has neither result nor error", c.method)
		}
		return fold.add(ev), nil
	})
	if err != nil {
		return nil, err
	}
	if raw != nil {
		return raw, nil
	}
	out, err := json.Marshal(a2a.StreamResponse{Event: fold.result})
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: encode %s result: %w", c.method, err)
	}
	return out, nil
}

// isSingleResult reports whether a SendMessage result is one Task or one Message in the v1.0
// shape (an object whose only member is "task" or "message", holding an object): the result that
// ends the call at once (EndsReplies) and needs no folding.
func isSingleResult(result json.RawMessage) bool {
	key := onlyObjectMember(result)
	return key == "task" || key == "message"
}

// onlyObjectMember is the name of a JSON object's only member when that member holds an
// object, else "". It scans the bytes (encoding/json has accepted them already, as the reply's
// result) without decoding them.
func onlyObjectMember(result json.RawMessage) string {
	p := bytes.TrimSpace(result)
	if len(p) == 0 || p[0] != '{' {
		return ""
	}
	keys, depth, expectKey := 0, 0, false
	var first []byte
	valueObject := false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '{', '[':
			if depth == 1 && keys == 1 && first != nil && !valueObject {
				valueObject = c == '{'
			}
			depth++
			expectKey = depth == 1 && c == '{'
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		case '"':
			j := i + 1
			for ; j < len(p) && p[j] != '"'; j++ {
				if p[j] == '\\' {
					j++
				}
			}
			if j >= len(p) {
				return ""
			}
			if depth == 1 && expectKey {
				keys++
				if keys > 1 {
					return ""
				}
				first = p[i+1 : j]
				expectKey = false
			}
			i = j
		}
	}
	if keys != 1 || !valueObject {
		return ""
	}
	return string(first)
}

// resultEnvelope wraps a raw result as the JSON-RPC response decodeStreamReply reads.
func resultEnvelope(result json.RawMessage) []byte {
	b := make([]byte, 0, len(result)+11)
	b = append(b, `{"result":`...)
	b = append(b, result...)
	return append(b, '}')
}
