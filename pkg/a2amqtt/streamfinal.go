package a2amqtt

import "github.com/a2aproject/a2a-go/v2/a2a"

// Which reply ends a request's replies ("stream-final"). One definition, used by the SDK's
// requester (SendMessage folds a stream, SendStreamingMessage and SubscribeToTask yield one),
// its direct handler, and the conversation service's relay (internal/convservice), so a route
// ends at the same reply wherever it is read. docs/protocol.md ("Streams") has the table.

// ReplyKind is what one JSON-RPC reply carries, as far as ending its stream is concerned.
type ReplyKind int

const (
	// ReplyOther is a result that is none of the kinds below (ListTasks, a card) or that could
	// not be read.
	ReplyOther ReplyKind = iota
	// ReplyStatusUpdate is a TaskStatusUpdateEvent.
	ReplyStatusUpdate
	// ReplyArtifactUpdate is a TaskArtifactUpdateEvent.
	ReplyArtifactUpdate
	// ReplyTask is a Task object (a unary result or a snapshot in a stream).
	ReplyTask
	// ReplyMessage is a direct Message answer.
	ReplyMessage
	// ReplyError is a JSON-RPC error.
	ReplyError
)

// ReplyItem is what decides whether one reply ends the replies to its request.
type ReplyItem struct {
	Kind ReplyKind
	// State is the task state of a status update or a Task.
	State a2a.TaskState
	// Final is A2A v0.3's explicit "final" marker of a status update.
	Final bool
	// First is set on the first reply on the request's correlation.
	First bool
}

// EndsReplies reports whether item is the last reply to a request of method:
//
//   - GetTask, CancelTask, ListTasks and every other method but the three below: one reply;
//   - an error or a direct Message: always;
//   - a status update: a terminal state, input-required, auth-required (or v0.3's final marker);
//   - an artifact update: never;
//   - a Task as the first reply: for SendMessage it is the method's single result, so always;
//     for SendStreamingMessage and SubscribeToTask it is the snapshot core A2A servers open a
//     stream with (on a resume it still shows the input-required state the message answers),
//     so only when terminal;
//   - a Task after the first reply: a snapshot, final when its state is;
//   - anything else: a SendMessage result (always), not a stream item (never).
//
// So a SendMessage answered with a stream of events (status and artifact updates, as the
// A2A-over-MQTT profile's user story has the agent do) ends at its stream-final event, as a
// SendStreamingMessage does, and a SendMessage answered with one Task or Message ends at once.
func EndsReplies(method string, item ReplyItem) bool {
	if !RepliesMayStream(method) {
		return true
	}
	switch item.Kind {
	case ReplyError, ReplyMessage:
		return true
	case ReplyArtifactUpdate:
		return false
	case ReplyStatusUpdate:
		return item.Final || stateEndsStream(item.State)
	case ReplyTask:
		switch {
		case !item.First:
			return stateEndsStream(item.State)
		case method == MethodSendMessage:
			return true
		default:
			return item.State.Terminal()
		}
	}
	return method == MethodSendMessage
}

// RepliesMayStream reports whether a request of method may be answered with several replies
// on its correlation: the streaming methods, and SendMessage, which an agent may answer with
// a stream of events.
func RepliesMayStream(method string) bool {
	switch method {
	case MethodSendMessage, MethodSendStreamingMessage, MethodSubscribeToTask:
		return true
	}
	return false
}

// stateEndsStream reports whether a task in state s has stopped for now: a terminal state or
// an interrupted one (input-required, auth-required).
func stateEndsStream(s a2a.TaskState) bool {
	return s.Terminal() || s == a2a.TaskStateInputRequired || s == a2a.TaskStateAuthRequired
}

// replyItemOf describes an event the SDK decoded.
func replyItemOf(ev a2a.Event, first bool) ReplyItem {
	switch v := ev.(type) {
	case *a2a.Message:
		return ReplyItem{Kind: ReplyMessage, First: first}
	case *a2a.Task:
		return ReplyItem{Kind: ReplyTask, State: v.Status.State, First: first}
	case *a2a.TaskStatusUpdateEvent:
		return ReplyItem{Kind: ReplyStatusUpdate, State: v.Status.State, First: first}
	case *a2a.TaskArtifactUpdateEvent:
		return ReplyItem{Kind: ReplyArtifactUpdate, First: first}
	}
	return ReplyItem{Kind: ReplyOther, First: first}
}

// isStreamFinal reports whether ev, after the first item of a stream, ends it.
func isStreamFinal(ev a2a.Event) bool {
	return EndsReplies(MethodSendStreamingMessage, replyItemOf(ev, false))
}

// endsStream reports whether ev, the first item of a stream when first is set, ends it.
func endsStream(ev a2a.Event, first bool) bool {
	return EndsReplies(MethodSendStreamingMessage, replyItemOf(ev, first))
}
