package agents

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func agentMsg(ec *a2asrv.ExecutorContext, text string) *a2a.Message {
	return a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(text))
}

// cancelTask is the Cancel every example uses: the task simply stops.
func cancelTask(ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, agentMsg(ec, "canceled")), nil)
	}
}

// Echo answers "echo: <text>" with a working update, an artifact and a
// completed status.
type Echo struct{ Delay time.Duration }

// Execute implements a2asrv.AgentExecutor.
func (e *Echo) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		text := a2amqtt.TextOf(ec.Message)
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
			return
		}
		if err := wait(ctx, e.Delay); err != nil {
			yield(nil, err)
			return
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(text)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, agentMsg(ec, "echo: "+text)), nil)
	}
}

// Cancel implements a2asrv.AgentExecutor.
func (e *Echo) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return cancelTask(ec)
}

// Confirm is the confirmation-gated agent of the multi-turn guide (seed
// 001): a new task gets a plan and TASK_STATE_INPUT_REQUIRED ("Say 'go
// ahead' to proceed") with a continuation hint asking for an approval
// (expected_input approval, resume_scope same_task, history_policy none). An
// approve data part or a message containing "go ahead" does the work and
// completes; a deny data part cancels the task; anything else re-asks.
// Messages to finished tasks are refused by the SDK (UnsupportedOperation),
// see docs/protocol.md.
type Confirm struct{ Delay time.Duration }

// ConfirmPrompt is the question a new task stops at.
func ConfirmPrompt(plan string) string {
	return fmt.Sprintf("Here's my plan: %s. Say 'go ahead' to proceed.", plan)
}

// ConfirmReask is the question for a continuation without confirmation.
const ConfirmReask = "Please confirm."

// ConfirmHint is the continuation hint of Confirm's questions: an approval of this very task;
// it needs no history (the plan is in the task).
var ConfirmHint = a2amqtt.Continuation{
	ExpectedInput: a2amqtt.ExpectApproval,
	ResumeScope:   a2amqtt.ResumeSameTask,
	HistoryPolicy: a2amqtt.HistoryNone,
}

// Execute implements a2asrv.AgentExecutor.
func (c *Confirm) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		text := a2amqtt.TextOf(ec.Message)
		task := ec.StoredTask
		continuation := task != nil && task.Status.State == a2a.TaskStateInputRequired
		if !continuation {
			plan := "do " + strings.TrimSpace(text)
			yield(a2amqtt.InputRequired(ec, agentMsg(ec, ConfirmPrompt(plan)), ConfirmHint), nil)
			return
		}
		plan := "the plan"
		if len(task.History) > 0 {
			plan = "do " + strings.TrimSpace(a2amqtt.TextOf(task.History[0]))
		}
		approved, reason, answered := a2amqtt.ApprovalOf(ec.Message)
		switch {
		case answered && !approved:
			msg := "Not done: " + plan + " (denied"
			if reason != "" {
				msg += ": " + reason
			}
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, agentMsg(ec, msg+")")), nil)
			return
		case !answered && !strings.Contains(strings.ToLower(text), "go ahead"):
			yield(a2amqtt.InputRequired(ec, agentMsg(ec, ConfirmReask), ConfirmHint), nil)
			return
		}
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, agentMsg(ec, "working on: "+plan)), nil) {
			return
		}
		if err := wait(ctx, c.Delay); err != nil {
			yield(nil, err)
			return
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart("done: "+plan)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, agentMsg(ec, "Done: "+plan)), nil)
	}
}

// Cancel implements a2asrv.AgentExecutor.
func (c *Confirm) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return cancelTask(ec)
}

// Memory answers with what the user said in earlier turns of the same
// context and interrupts "remind me ..." requests with an input-required
// question that the next turn of the same task answers. It reads the three
// inputs of each turn separately (a2amqtt.InputsOf): the new message is the
// only instruction; earlier user messages are evidence it quotes, never
// follows; earlier artifacts are receipts it counts. Evidence comes from the
// responder's task store, or from the conversation service when the agent is
// configured with a history source (agents.Options.HistoryFrom).
type Memory struct{ Delay time.Duration }

// MemoryQuestion is what a "remind me" task stops at.
const MemoryQuestion = "When should I remind you?"

// MemoryHint is the continuation hint of the reminder question: free text for this task; the
// agent fetches what else it needs.
var MemoryHint = a2amqtt.Continuation{
	ExpectedInput: a2amqtt.ExpectFreeText,
	ResumeScope:   a2amqtt.ResumeSameTask,
	HistoryPolicy: a2amqtt.HistoryAgentFetched,
}

// Execute implements a2asrv.AgentExecutor.
func (m *Memory) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		in, err := a2amqtt.InputsOf(ctx, ec)
		if err != nil {
			yield(nil, fmt.Errorf("read the conversation so far: %w", err))
			return
		}
		text := strings.TrimSpace(a2amqtt.TextOf(in.Instruction))
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, agentMsg(ec, "thinking")), nil) {
			return
		}
		if err := wait(ctx, m.Delay); err != nil {
			yield(nil, err)
			return
		}
		task := ec.StoredTask
		if task != nil && task.Status.State == a2a.TaskStateInputRequired && len(task.History) > 0 {
			what := strings.TrimPrefix(strings.TrimSpace(a2amqtt.TextOf(task.History[0])), "remind me ")
			answer := fmt.Sprintf("OK, I will remind you %s %s.", what, text)
			yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(answer)), nil)
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, agentMsg(ec, answer)), nil)
			return
		}
		if strings.HasPrefix(strings.ToLower(text), "remind me") {
			yield(a2amqtt.InputRequired(ec, agentMsg(ec, MemoryQuestion), MemoryHint), nil)
			return
		}
		// Evidence: the first thing the user said in each earlier task of the context.
		var said []string
		var turns []a2a.TaskID
		for _, e := range in.Evidence {
			if e.Role != a2a.MessageRoleUser || e.TaskID == ec.TaskID || slices.Contains(turns, e.TaskID) {
				continue
			}
			turns = append(turns, e.TaskID)
			said = append(said, fmt.Sprintf("%q", a2amqtt.TextOf(e)))
		}
		answer := fmt.Sprintf("Turn %d. You said %q.", len(turns)+1, text)
		if len(said) > 0 {
			answer += " Earlier in this conversation you said: " + strings.Join(said, ", ") + "."
		} else {
			answer += " This is the start of our conversation."
		}
		switch n := len(in.Receipts); n {
		case 0:
		case 1:
			answer += " 1 earlier answer is on record."
		default:
			answer += fmt.Sprintf(" %d earlier answers are on record.", n)
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(answer)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, agentMsg(ec, answer)), nil)
	}
}

// Cancel implements a2asrv.AgentExecutor.
func (m *Memory) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return cancelTask(ec)
}
