package a2amqtt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

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
	m.Metadata[ContinuationExtensionURI] = c
	if !slices.Contains(m.Extensions, ContinuationExtensionURI) {
		m.Extensions = append(m.Extensions, ContinuationExtensionURI)
	}
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

type approvalData struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
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

// ApprovalOf finds an approval answer among m's parts: ok is false when there is none.
func ApprovalOf(m *a2a.Message) (approved bool, reason string, ok bool) {
	if m == nil {
		return false, "", false
	}
	for _, p := range m.Parts {
		if p == nil || p.Data() == nil {
			continue
		}
		b, err := json.Marshal(p.Data())
		if err != nil {
			continue
		}
		var a approvalData
		if json.Unmarshal(b, &a) != nil {
			continue
		}
		switch a.Decision {
		case ApprovalApprove:
			return true, a.Reason, true
		case ApprovalDeny:
			return false, a.Reason, true
		}
	}
	return false, "", false
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
