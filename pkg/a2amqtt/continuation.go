package a2amqtt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/gowebpki/jcs"
)

// ContinuationExtensionURI identifies the continuation hint extension (seed 004 §3): a responder
// that pauses a task in input-required or auth-required says what kind of answer it expects, how
// the conversation resumes, where prior turns come from, and which history it accepted. The
// hint travels in the status message: its Extensions list the URI and Metadata[URI] holds a
// Continuation. An agent that uses it declares the URI in its card's capabilities.extensions.
const ContinuationExtensionURI = "https://a2a-fleet.dev/extensions/continuation/v1"

// ExpectedInput is the kind of answer a paused task waits for.
type ExpectedInput string

const (
	ExpectFreeText           ExpectedInput = "free_text"
	ExpectStructuredArtifact ExpectedInput = "structured_artifact"
	ExpectApproval           ExpectedInput = "approval"
	ExpectCredential         ExpectedInput = "credential"
)

// ResumeScope says whether the answer continues the paused task or starts a new task in its context.
type ResumeScope string

const (
	ResumeSameTask         ResumeScope = "same_task"
	ResumeNewTaskInContext ResumeScope = "new_task_in_context"
)

// HistoryPolicy says where the responder takes prior turns from.
type HistoryPolicy string

const (
	HistoryClientSupplied HistoryPolicy = "client_supplied"
	HistoryAgentFetched   HistoryPolicy = "agent_fetched"
	HistoryNone           HistoryPolicy = "none"
)

// Continuation is the continuation hint block; every field is optional.
type Continuation struct {
	ExpectedInput         ExpectedInput `json:"expected_input,omitempty"`
	ResumeScope           ResumeScope   `json:"resume_scope,omitempty"`
	HistoryPolicy         HistoryPolicy `json:"history_policy,omitempty"`
	AcceptedHistoryDigest string        `json:"accepted_history_digest,omitempty"`
}

// Validate refuses values outside the extension's vocabulary.
func (c Continuation) Validate() error {
	switch c.ExpectedInput {
	case "", ExpectFreeText, ExpectStructuredArtifact, ExpectApproval, ExpectCredential:
	default:
		return fmt.Errorf("continuation: unknown expected_input %q", c.ExpectedInput)
	}
	switch c.ResumeScope {
	case "", ResumeSameTask, ResumeNewTaskInContext:
	default:
		return fmt.Errorf("continuation: unknown resume_scope %q", c.ResumeScope)
	}
	switch c.HistoryPolicy {
	case "", HistoryClientSupplied, HistoryAgentFetched, HistoryNone:
	default:
		return fmt.Errorf("continuation: unknown history_policy %q", c.HistoryPolicy)
	}
	return nil
}

// SetContinuation puts c into m's metadata under the extension URI and lists the URI in
// m.Extensions (once).
func SetContinuation(m *a2a.Message, c Continuation) {
	if m.Metadata == nil {
		m.Metadata = map[string]any{}
	}
	// Stored in its JSON form: task stores copy metadata generically (a2a-go's in-memory store
	// uses gob, which refuses unregistered types).
	m.Metadata[ContinuationExtensionURI] = c.jsonObject()
	if !slices.Contains(m.Extensions, ContinuationExtensionURI) {
		m.Extensions = append(m.Extensions, ContinuationExtensionURI)
	}
}

// jsonObject is c as a decoded JSON object (omitted fields absent).
func (c Continuation) jsonObject() map[string]any {
	obj := map[string]any{}
	for k, v := range map[string]string{
		"expected_input": string(c.ExpectedInput), "resume_scope": string(c.ResumeScope),
		"history_policy": string(c.HistoryPolicy), "accepted_history_digest": c.AcceptedHistoryDigest,
	} {
		if v != "" {
			obj[k] = v
		}
	}
	return obj
}

// ContinuationOf reads the continuation hint of a status message. ok is false when the message
// carries none; err reports a hint that is present but malformed.
func ContinuationOf(m *a2a.Message) (c Continuation, ok bool, err error) {
	if m == nil || m.Metadata == nil {
		return Continuation{}, false, nil
	}
	raw, present := m.Metadata[ContinuationExtensionURI]
	if !present {
		return Continuation{}, false, nil
	}
	switch v := raw.(type) {
	case Continuation:
		c = v
	case *Continuation:
		c = *v
	default:
		// Decoded JSON (map[string]any) or anything else: round-trip through JSON.
		b, merr := json.Marshal(v)
		if merr != nil {
			return Continuation{}, true, fmt.Errorf("continuation: %w", merr)
		}
		if uerr := json.Unmarshal(b, &c); uerr != nil {
			return Continuation{}, true, fmt.Errorf("continuation: %w", uerr)
		}
	}
	return c, true, c.Validate()
}

// Approval answers are a data part {"decision": "approve"|"deny", "reason": "..."}.
const (
	ApprovalApprove = "approve"
	ApprovalDeny    = "deny"
)

// KagentHITLExtensionURI is kagent's human-in-the-loop extension. ApprovalOf accepts its
// tool_approval_response (message metadata under this URI, the URI listed in the message's
// extensions) as an approval answer, so a kagent-style client can answer an a2a-fleet agent's
// approval request (docs/protocol.md).
const KagentHITLExtensionURI = "https://kagent.dev/extensions/hitl/v1"

type approvalData struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
	// DecisionType is kagent's earlier data-part form {"decision_type": "approve"|"deny"|"reject"}.
	DecisionType string `json:"decision_type,omitempty"`
}

// kagentApprovalResponse is kagent hitl/v1's tool_approval_response.
type kagentApprovalResponse struct {
	Type      string `json:"type"`
	Approvals []struct {
		ID              string `json:"id"`
		Approved        *bool  `json:"approved"`
		RejectionReason string `json:"rejection_reason,omitempty"`
	} `json:"approvals"`
}

// ApprovalPart is the data part that answers an approval request.
func ApprovalPart(approve bool, reason string) *a2a.Part {
	d := ApprovalDeny
	if approve {
		d = ApprovalApprove
	}
	data := map[string]any{"decision": d}
	if reason != "" {
		data["reason"] = reason
	}
	return a2a.NewDataPart(data)
}

// ApprovalMessage is a user message answering an approval request: the approval data part and,
// for readers that only look at text, the same decision as text ("approve" or "deny: reason").
func ApprovalMessage(approve bool, reason string) *a2a.Message {
	text := ApprovalDeny
	if approve {
		text = ApprovalApprove
	}
	if reason != "" {
		text += ": " + reason
	}
	return a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text), ApprovalPart(approve, reason))
}

// ApprovalOf finds an approval answer in m: ok is false when there is none. It accepts
//   - the extension's data part {"decision": "approve"|"deny", "reason": "..."};
//   - kagent's data part {"decision_type": "approve"|"deny"|"reject"};
//   - kagent hitl/v1's tool_approval_response in m.Metadata[KagentHITLExtensionURI] when m lists
//     that URI in its extensions (kagent's own rule): approved only when every listed call is
//     approved; the reason joins the rejection reasons.
//
// Text such as "go ahead" is not an approval answer: an agent may accept it too, but the
// conversation service requires the structured form where approval was declared.
func ApprovalOf(m *a2a.Message) (approved bool, reason string, ok bool) {
	if m == nil {
		return false, "", false
	}
	for _, p := range m.Parts {
		if p == nil || p.Data() == nil {
			continue
		}
		var a approvalData
		if !decodeVia(p.Data(), &a) {
			continue
		}
		switch a.Decision {
		case ApprovalApprove:
			return true, a.Reason, true
		case ApprovalDeny:
			return false, a.Reason, true
		}
		switch a.DecisionType {
		case "approve":
			return true, a.Reason, true
		case "deny", "reject":
			return false, a.Reason, true
		}
	}
	if m.Metadata != nil && slices.Contains(m.Extensions, KagentHITLExtensionURI) {
		var r kagentApprovalResponse
		if decodeVia(m.Metadata[KagentHITLExtensionURI], &r) && r.Type == "tool_approval_response" && len(r.Approvals) > 0 {
			approved = true
			var reasons []string
			for _, a := range r.Approvals {
				if a.Approved == nil {
					return false, "", false
				}
				if !*a.Approved {
					approved = false
					if a.RejectionReason != "" {
						reasons = append(reasons, a.RejectionReason)
					}
				}
			}
			return approved, strings.Join(reasons, "; "), true
		}
	}
	return false, "", false
}

// decodeVia converts a decoded JSON value (map[string]any, a struct) into out through JSON.
func decodeVia(v any, out any) bool {
	if v == nil {
		return false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return json.Unmarshal(b, out) == nil
}

// historyDigestPreimage is the object whose canonical form is hashed.
type historyDigestPreimage struct {
	V         int               `json:"v"`
	Message   json.RawMessage   `json:"message"`
	History   []json.RawMessage `json:"history"`
	Artifacts []string          `json:"artifacts"`
}

// HistoryDigest is the accepted_history_digest of a turn: "sha256:" and the hex SHA-256 of the
// RFC 8785 (JSON Canonicalization Scheme) form of the object
// {"v":1,"message":M,"history":[H...],"artifacts":[A...]}, where M and H are the new message and
// the history window (oldest first) as A2A v1.0 JSON message objects and A the relevant artifact
// ids, sorted and deduplicated. JCS fixes key order, escapes and number forms, so any
// implementation that has the messages' JSON recomputes the same digest: a responder or an
// auditor can check what an agent was shown (docs/protocol.md has a worked example).
func HistoryDigest(msg *a2a.Message, history []*a2a.Message, artifactIDs []string) (string, error) {
	pre := historyDigestPreimage{V: 1, Message: json.RawMessage("null"), History: make([]json.RawMessage, 0, len(history))}
	var err error
	if msg != nil {
		if pre.Message, err = json.Marshal(msg); err != nil {
			return "", fmt.Errorf("history digest: message: %w", err)
		}
	}
	for i, h := range history {
		b, err := json.Marshal(h)
		if err != nil {
			return "", fmt.Errorf("history digest: history[%d]: %w", i, err)
		}
		pre.History = append(pre.History, b)
	}
	pre.Artifacts = slices.Compact(slices.Sorted(slices.Values(artifactIDs)))
	if pre.Artifacts == nil {
		pre.Artifacts = []string{}
	}
	b, err := json.Marshal(pre)
	if err != nil {
		return "", fmt.Errorf("history digest: %w", err)
	}
	canonical, err := jcs.Transform(b)
	if err != nil {
		return "", fmt.Errorf("history digest: canonicalize: %w", err)
	}
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
