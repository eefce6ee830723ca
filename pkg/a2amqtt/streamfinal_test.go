package a2amqtt

import (
	"fmt"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// TestEndsReplies is the stream-final table (docs/protocol.md "Streams"): every reply kind and
// state, first or later, for every method.
func TestEndsReplies(t *testing.T) {
	type row struct {
		item ReplyItem
		// want for SendMessage, SendStreamingMessage, SubscribeToTask.
		send, stream, subscribe bool
	}
	const (
		working   = a2a.TaskStateWorking
		submitted = a2a.TaskStateSubmitted
		completed = a2a.TaskStateCompleted
		failed    = a2a.TaskStateFailed
		canceled  = a2a.TaskStateCanceled
		rejected  = a2a.TaskStateRejected
		input     = a2a.TaskStateInputRequired
		auth      = a2a.TaskStateAuthRequired
	)
	var rows []row
	for _, first := range []bool{true, false} {
		add := func(kind ReplyKind, state a2a.TaskState, final bool, send, stream bool) {
			rows = append(rows, row{ReplyItem{Kind: kind, State: state, Final: final, First: first}, send, stream, stream})
		}
		// Status updates: stopped states end every stream, whatever their position.
		for _, s := range []a2a.TaskState{submitted, working} {
			add(ReplyStatusUpdate, s, false, false, false)
		}
		for _, s := range []a2a.TaskState{completed, failed, canceled, rejected, input, auth} {
			add(ReplyStatusUpdate, s, false, true, true)
		}
		// v0.3's explicit final marker.
		add(ReplyStatusUpdate, working, true, true, true)
		// Artifacts never end a stream.
		add(ReplyArtifactUpdate, a2a.TaskStateUnspecified, false, false, false)
		// A direct Message and an error always do.
		add(ReplyMessage, a2a.TaskStateUnspecified, false, true, true)
		add(ReplyError, a2a.TaskStateUnspecified, false, true, true)
		// A result that is no stream item ends SendMessage (its result) but not a stream.
		add(ReplyOther, a2a.TaskStateUnspecified, false, true, false)
		// Tasks: SendMessage's first reply is its result; a stream's opening Task ends it only
		// when terminal; a later Task is a snapshot, final when its state is.
		for _, s := range []a2a.TaskState{submitted, working, input, auth, completed, failed} {
			switch {
			case first:
				add(ReplyTask, s, false, true, s.Terminal())
			default:
				add(ReplyTask, s, false, stateEndsStream(s), stateEndsStream(s))
			}
		}
	}
	for _, r := range rows {
		name := fmt.Sprintf("kind=%d state=%s final=%v first=%v", r.item.Kind, r.item.State, r.item.Final, r.item.First)
		for method, want := range map[string]bool{
			MethodSendMessage:          r.send,
			MethodSendStreamingMessage: r.stream,
			MethodSubscribeToTask:      r.subscribe,
			// One reply, whatever it carries.
			MethodGetTask:              true,
			MethodCancelTask:           true,
			MethodListTasks:            true,
			MethodGetExtendedAgentCard: true,
		} {
			if got := EndsReplies(method, r.item); got != want {
				t.Errorf("%s %s: EndsReplies = %v, want %v", method, name, got, want)
			}
		}
	}
	// The cases the user story turns on, spelled out.
	story := []struct {
		name string
		item ReplyItem
		want bool
	}{
		{"SendMessage answered WORKING first", ReplyItem{Kind: ReplyStatusUpdate, State: working, First: true}, false},
		{"then an artifact", ReplyItem{Kind: ReplyArtifactUpdate}, false},
		{"then COMPLETED", ReplyItem{Kind: ReplyStatusUpdate, State: completed}, true},
		{"or INPUT_REQUIRED", ReplyItem{Kind: ReplyStatusUpdate, State: input}, true},
		{"SendMessage answered with one working Task (non-blocking)", ReplyItem{Kind: ReplyTask, State: working, First: true}, true},
	}
	for _, c := range story {
		if got := EndsReplies(MethodSendMessage, c.item); got != c.want {
			t.Errorf("%s: EndsReplies = %v, want %v", c.name, got, c.want)
		}
	}
	if !RepliesMayStream(MethodSendMessage) || RepliesMayStream(MethodGetTask) {
		t.Error("RepliesMayStream: SendMessage may stream, GetTask may not")
	}
}

// TestEndsRepliesOfDecodedEvents checks the SDK's reading of decoded a2a-go events.
func TestEndsRepliesOfDecodedEvents(t *testing.T) {
	task := &a2a.Task{ID: "t", Status: a2a.TaskStatus{State: a2a.TaskStateInputRequired}}
	cases := []struct {
		ev          a2a.Event
		first, want bool
	}{
		{task, true, false}, // a resume's opening snapshot
		{task, false, true},
		{&a2a.TaskStatusUpdateEvent{Status: a2a.TaskStatus{State: a2a.TaskStateWorking}}, true, false},
		{&a2a.TaskStatusUpdateEvent{Status: a2a.TaskStatus{State: a2a.TaskStateCompleted}}, false, true},
		{&a2a.TaskArtifactUpdateEvent{}, false, false},
		{a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("hi")), true, true},
	}
	for i, c := range cases {
		if got := endsStream(c.ev, c.first); got != c.want {
			t.Errorf("case %d (%T first=%v): endsStream = %v, want %v", i, c.ev, c.first, got, c.want)
		}
	}
}
