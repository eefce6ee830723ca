package convservice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// kagentHITLExtension is kagent's human-in-the-loop extension: a user
// message whose metadata under this URI has type tool_approval_response is
// an approval answer too (the peer convention; seed 004 asks to
// interoperate where cheap).
const kagentHITLExtension = "https://kagent.dev/extensions/hitl/v1"

// hintOf reads the continuation hint of a status message (nil: none). A
// malformed hint is reported and ignored by the caller: an agent's typo
// must not make its own task unanswerable.
func hintOf(statusMessage json.RawMessage) (*conversation.Continuation, error) {
	if len(statusMessage) == 0 || !bytes.Contains(statusMessage, []byte(a2amqtt.ContinuationExtensionURI)) {
		return nil, nil
	}
	var m struct {
		Metadata map[string]any `json:"metadata"`
	}
	if err := json.Unmarshal(statusMessage, &m); err != nil {
		return nil, fmt.Errorf("status message: %w", err)
	}
	c, ok, err := a2amqtt.ContinuationOf(&a2a.Message{Metadata: m.Metadata})
	if err != nil || !ok {
		return nil, err
	}
	h := engineHint(c)
	return &h, nil
}

func engineHint(c a2amqtt.Continuation) conversation.Continuation {
	return conversation.Continuation{ExpectedInput: string(c.ExpectedInput), ResumeScope: string(c.ResumeScope),
		HistoryPolicy: string(c.HistoryPolicy), AcceptedHistoryDigest: c.AcceptedHistoryDigest}
}

func wireHint(h conversation.Continuation) a2amqtt.Continuation {
	return a2amqtt.Continuation{ExpectedInput: a2amqtt.ExpectedInput(h.ExpectedInput), ResumeScope: a2amqtt.ResumeScope(h.ResumeScope),
		HistoryPolicy: a2amqtt.HistoryPolicy(h.HistoryPolicy), AcceptedHistoryDigest: h.AcceptedHistoryDigest}
}

// withDigest returns the hint to record for a pause: the agent's hint (or
// none) with the service's accepted_history_digest. The service's digest
// replaces one the agent put there: it covers what the service can vouch
// for (the message it forwarded and the history it served).
func withDigest(h *conversation.Continuation, digest string) *conversation.Continuation {
	if digest == "" {
		return h
	}
	var n conversation.Continuation
	if h != nil {
		n = *h
	}
	n.AcceptedHistoryDigest = digest
	return &n
}

// isApproval reports whether a send request's message answers an approval:
// an approve/deny data part (a2amqtt.ApprovalOf) or kagent's
// tool_approval_response. Requests that cannot contain one are not decoded.
func isApproval(payload []byte, dialect a2amqtt.Dialect) bool {
	if !bytes.Contains(payload, []byte(`"decision"`)) && !bytes.Contains(payload, []byte("tool_approval_response")) {
		return false
	}
	m, err := requestMessage(payload, dialect)
	if err != nil {
		return false
	}
	if _, _, ok := a2amqtt.ApprovalOf(m); ok {
		return true
	}
	if v, ok := m.Metadata[kagentHITLExtension].(map[string]any); ok && v["type"] == "tool_approval_response" {
		return true
	}
	return false
}

// errNoStatusMessage: the reply's status has no message to carry a hint.
var errNoStatusMessage = errors.New("status has no message")

// stampHint writes hint into the status message of a status update or task
// reply (v1.0 or v0.3): metadata[ContinuationExtensionURI] and the URI in
// the message's extensions. The rest of the reply is kept byte for byte
// where it can be (only the objects on the path to the message are
// re-encoded).
func stampHint(payload []byte, hint conversation.Continuation) ([]byte, error) {
	return editJSON(payload, func(env map[string]json.RawMessage) error {
		return editObject(env, "result", func(res map[string]json.RawMessage) error {
			holder := res
			for _, k := range []string{"statusUpdate", "task"} {
				if _, ok := res[k]; ok {
					return editObject(res, k, func(o map[string]json.RawMessage) error { return stampStatus(o, hint) })
				}
			}
			return stampStatus(holder, hint)
		})
	})
}

func stampStatus(o map[string]json.RawMessage, hint conversation.Continuation) error {
	return editObject(o, "status", func(st map[string]json.RawMessage) error {
		if m, ok := st["message"]; !ok || string(m) == "null" {
			return errNoStatusMessage
		}
		return editObject(st, "message", func(msg map[string]json.RawMessage) error {
			var meta map[string]json.RawMessage
			if raw, ok := msg["metadata"]; ok && string(raw) != "null" {
				if err := json.Unmarshal(raw, &meta); err != nil {
					return fmt.Errorf("status message metadata: %w", err)
				}
			}
			if meta == nil {
				meta = map[string]json.RawMessage{}
			}
			b, err := json.Marshal(wireHint(hint))
			if err != nil {
				return err
			}
			meta[a2amqtt.ContinuationExtensionURI] = b
			if msg["metadata"], err = json.Marshal(meta); err != nil {
				return err
			}
			var exts []string
			if raw, ok := msg["extensions"]; ok && string(raw) != "null" {
				if err := json.Unmarshal(raw, &exts); err != nil {
					return fmt.Errorf("status message extensions: %w", err)
				}
			}
			if !slices.Contains(exts, a2amqtt.ContinuationExtensionURI) {
				exts = append(exts, a2amqtt.ContinuationExtensionURI)
				if msg["extensions"], err = json.Marshal(exts); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// editJSON decodes a JSON object one level, lets fn change its members and
// encodes it again.
func editJSON(payload []byte, fn func(map[string]json.RawMessage) error) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(payload, &obj); err != nil {
		return nil, err
	}
	if err := fn(obj); err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}

// editObject edits the object member key of obj in place.
func editObject(obj map[string]json.RawMessage, key string, fn func(map[string]json.RawMessage) error) error {
	raw, ok := obj[key]
	if !ok {
		return fmt.Errorf("no %q member", key)
	}
	b, err := editJSON(raw, fn)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	obj[key] = b
	return nil
}
