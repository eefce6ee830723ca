package a2amqtt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/a2aproject/a2a-go/v2/a2asrv/taskstore"
)

// The three inputs of a turn (seed 004 §2): a message that arrives in a context with earlier
// tasks brings three things an agent must keep apart, because only one of them authorizes
// anything:
//
//   - the new message: the instruction;
//   - prior turns (user and agent messages of the context): evidence of what was said, not new
//     instructions;
//   - prior artifacts: receipts of what was done, verifiable, not instructions.
//
// InputsOf hands an executor the three as separate typed values; the SDK never merges them into
// one prompt (an executor that builds a prompt decides how to mark evidence as evidence).

// Inputs are the three inputs of one turn.
type Inputs struct {
	// Instruction is the new message: the only input that instructs the agent.
	Instruction *a2a.Message
	// Evidence are the prior turns, oldest first: the context's earlier tasks' messages and this
	// task's own earlier messages (e.g. the question an answer resumes), never the instruction.
	Evidence []*a2a.Message
	// Receipts are the artifacts the context's tasks produced so far, oldest task first.
	Receipts []Receipt
	// Policy says where Evidence and Receipts came from: HistoryClientSupplied (the request
	// carried them), HistoryAgentFetched (the responder fetched them), HistoryNone.
	Policy HistoryPolicy
	// Source names the place: SourceRequest, SourceHistoryService, SourceTaskStore, or "".
	Source EvidenceSource
}

// EvidenceSource names where InputsOf found prior turns.
type EvidenceSource string

const (
	// SourceRequest: the requester supplied them in the request (client_supplied).
	SourceRequest EvidenceSource = "request"
	// SourceHistoryService: fetched from ResponderOptions.HistoryFrom (a2a-fleet's conversation
	// service) with ListTasks and historyLength (agent_fetched).
	SourceHistoryService EvidenceSource = "history-service"
	// SourceTaskStore: read from the responder's own task store (agent_fetched).
	SourceTaskStore EvidenceSource = "task-store"
)

// Receipt is an artifact of a task of the context.
type Receipt struct {
	TaskID   a2a.TaskID
	Artifact *a2a.Artifact
}

// ArtifactIDs are the receipts' artifact ids, sorted and deduplicated (the artifacts of a
// history digest).
func (in Inputs) ArtifactIDs() []string {
	ids := make([]string, 0, len(in.Receipts))
	for _, r := range in.Receipts {
		if r.Artifact != nil {
			ids = append(ids, string(r.Artifact.ID))
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// Digest is the accepted_history_digest of what the executor was shown: HistoryDigest over the
// instruction, the evidence and the receipts' artifact ids. An executor that declares a
// continuation hint may put it there so a requester or an auditor can check what the turn
// rested on (the conversation service stamps its own, over what it served; docs/protocol.md).
func (in Inputs) Digest() (string, error) {
	return HistoryDigest(in.Instruction, in.Evidence, in.ArtifactIDs())
}

// SuppliedHistory is how a requester supplies prior turns (history_policy client_supplied) in
// A2A v1.0 terms: the request's params.metadata holds, under ContinuationExtensionURI, the
// context's earlier tasks as A2A v1.0 Task objects (oldest first, each with its history and
// artifacts), the shape a ListTasks answer has. Nothing of it is part of the message, so the
// instruction stays what the user said.
type SuppliedHistory struct {
	Tasks []*a2a.Task `json:"tasks"`
}

// SupplyHistory puts h into req's metadata (params.metadata[ContinuationExtensionURI]).
func SupplyHistory(req *a2a.SendMessageRequest, h SuppliedHistory) {
	if req.Metadata == nil {
		req.Metadata = map[string]any{}
	}
	if h.Tasks == nil {
		h.Tasks = []*a2a.Task{}
	}
	// Stored in its JSON form, like SetContinuation, so generic metadata copies keep working.
	var obj map[string]any
	if !decodeVia(h, &obj) {
		obj = map[string]any{"tasks": []any{}}
	}
	req.Metadata[ContinuationExtensionURI] = obj
}

// SuppliedHistoryOf reads the history a request's metadata supplies; ok is false without one.
func SuppliedHistoryOf(metadata map[string]any) (h SuppliedHistory, ok bool, err error) {
	raw, present := metadata[ContinuationExtensionURI]
	if !present {
		return SuppliedHistory{}, false, nil
	}
	switch v := raw.(type) {
	case SuppliedHistory:
		return v, true, nil
	case *SuppliedHistory:
		return *v, true, nil
	}
	if !decodeVia(raw, &h) {
		return SuppliedHistory{}, true, fmt.Errorf("a2amqtt: params.metadata[%s] is not {\"tasks\": [A2A Task...]}", ContinuationExtensionURI)
	}
	return h, true, nil
}

// DefaultHistoryLength bounds Evidence when ResponderOptions.HistoryLength is unset.
const DefaultHistoryLength = 50

// inputsConfig is what a responder gives InputsOf (through the request context).
type inputsConfig struct {
	store   taskstore.Store
	policy  HistoryPolicy
	length  int
	history *Transport // HistoryFrom, nil when unset
}

// scopeKey carries the responder's inputsConfig into executor contexts (a2a-go runs executors on
// a detached context that keeps values).
type scopeKey struct{}

func scopeOf(ctx context.Context) (*inputsConfig, bool) {
	s, ok := ctx.Value(scopeKey{}).(*inputsConfig)
	return s, ok
}

// InputsOf returns the three inputs of the turn ec executes, from the sources the responder
// was configured with (ResponderOptions.History, HistoryFrom, HistoryLength). It must be called
// inside an executor served by a Responder. An error means the configured source failed (e.g.
// the history service did not answer): the executor decides whether to go on without evidence.
func InputsOf(ctx context.Context, ec *a2asrv.ExecutorContext) (Inputs, error) {
	cfg, ok := scopeOf(ctx)
	if !ok {
		return Inputs{}, errors.New("a2amqtt: InputsOf called outside a responder request")
	}
	in := Inputs{Instruction: ec.Message, Policy: HistoryNone}
	if cfg.policy == HistoryNone {
		return in, nil
	}
	var tasks []*a2a.Task
	supplied, hasSupplied, err := SuppliedHistoryOf(ec.Metadata)
	switch {
	case err != nil && cfg.policy == HistoryClientSupplied:
		return in, err
	case hasSupplied && err == nil && cfg.policy != HistoryAgentFetched:
		in.Policy, in.Source = HistoryClientSupplied, SourceRequest
		tasks = supplied.Tasks
		// The task being resumed is the responder's own: its earlier messages come from the
		// stored task, not from the requester.
		tasks = slices.DeleteFunc(slices.Clone(tasks), func(t *a2a.Task) bool { return t == nil || t.ID == ec.TaskID })
		if ec.StoredTask != nil {
			tasks = append(tasks, ec.StoredTask)
		}
	case cfg.policy == HistoryClientSupplied:
		// Nothing supplied: the turn has no evidence but this task's own.
		in.Policy, in.Source = HistoryClientSupplied, SourceRequest
		if ec.StoredTask != nil {
			tasks = []*a2a.Task{ec.StoredTask}
		}
	case cfg.history != nil:
		in.Policy, in.Source = HistoryAgentFetched, SourceHistoryService
		if tasks, err = fetchHistory(ctx, cfg.history, ec.ContextID, cfg.length); err != nil {
			return in, err
		}
		if hasContent(tasks) {
			break
		}
		// The service keeps no content for this context (its policy's history mode is not
		// Messages, or the request did not come through it): the responder's own tasks are the
		// only record.
		fallthrough
	default:
		in.Policy, in.Source = HistoryAgentFetched, SourceTaskStore
		if tasks, err = listContext(ctx, cfg.store, ec.ContextID, ec.TaskID); err != nil {
			return in, err
		}
		if ec.StoredTask != nil {
			tasks = append(tasks, ec.StoredTask)
		}
	}
	in.Evidence, in.Receipts = splitHistory(tasks, ec.Message, cfg.length)
	return in, nil
}

// hasContent reports whether any task carries messages or artifacts.
func hasContent(tasks []*a2a.Task) bool {
	return slices.ContainsFunc(tasks, func(t *a2a.Task) bool { return len(t.History) > 0 || len(t.Artifacts) > 0 })
}

// fetchHistory lists the context's tasks (messages and artifacts) from the history service,
// oldest first.
func fetchHistory(ctx context.Context, tr *Transport, contextID string, length int) ([]*a2a.Task, error) {
	if contextID == "" {
		return nil, nil
	}
	n := length
	var out []*a2a.Task
	req := &a2a.ListTasksRequest{ContextID: contextID, HistoryLength: &n, IncludeArtifacts: true, PageSize: 100}
	for range 10 { // at most 1 000 tasks; the service bounds history per context anyway
		resp, err := tr.ListTasks(ctx, nil, req)
		if err != nil {
			return nil, fmt.Errorf("a2amqtt: fetch history of context %s from %s: %w", contextID, tr.Target(), err)
		}
		out = append(out, resp.Tasks...)
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	// ListTasks answers newest first; turns read oldest first. The service records each task's
	// creation time in metadata.createdAt; without it the answer's order is reversed.
	slices.Reverse(out)
	slices.SortStableFunc(out, func(a, b *a2a.Task) int {
		ta, oka := createdAt(a)
		tb, okb := createdAt(b)
		if !oka || !okb {
			return 0
		}
		return ta.Compare(tb)
	})
	return out, nil
}

func createdAt(t *a2a.Task) (time.Time, bool) {
	s, ok := t.Metadata["createdAt"].(string)
	if !ok {
		return time.Time{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	return ts, err == nil
}

// splitHistory turns tasks (oldest first) into evidence (their messages and final status
// messages, without the instruction, deduplicated by message id, the last length kept) and
// receipts (their artifacts).
func splitHistory(tasks []*a2a.Task, instruction *a2a.Message, length int) ([]*a2a.Message, []Receipt) {
	seen := map[string]bool{}
	if instruction != nil && instruction.ID != "" {
		seen[instruction.ID] = true
	}
	var evidence []*a2a.Message
	add := func(m *a2a.Message) {
		if m == nil || (m.ID != "" && seen[m.ID]) {
			return
		}
		if m.ID != "" {
			seen[m.ID] = true
		}
		evidence = append(evidence, m)
	}
	var receipts []Receipt
	for _, t := range tasks {
		if t == nil {
			continue
		}
		for _, m := range t.History {
			add(m)
		}
		add(t.Status.Message)
		for _, a := range t.Artifacts {
			if a != nil {
				receipts = append(receipts, Receipt{TaskID: t.ID, Artifact: a})
			}
		}
	}
	if length > 0 && len(evidence) > length {
		evidence = evidence[len(evidence)-length:]
	}
	return evidence, receipts
}

// historyLengthOrDefault resolves ResponderOptions.HistoryLength.
func historyLengthOrDefault(n int) int { return cmp.Or(max(n, 0), DefaultHistoryLength) }
