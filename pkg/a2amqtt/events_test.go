package a2amqtt

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// The SDK's stream-event codec is a2a-go's, byte for byte: the same JSON out of every event
// type, the same event back, and the same inputs refused.
func TestStreamEventMatchesA2AGo(t *testing.T) {
	task := &a2a.Task{ID: "t", ContextID: "c", Status: a2a.TaskStatus{State: a2a.TaskStateWorking}}
	msg := a2a.NewMessageForTask(a2a.MessageRoleAgent, task, a2a.NewTextPart("<b>&</b>"), a2a.NewDataPart(map[string]any{"k": 1.5}))
	events := []a2a.Event{
		msg,
		&a2a.Task{ID: "t", ContextID: "c", Status: a2a.TaskStatus{State: a2a.TaskStateInputRequired, Message: msg}, History: []*a2a.Message{msg}, Metadata: map[string]any{"x": "y"}},
		a2a.NewStatusUpdateEvent(task, a2a.TaskStateCompleted, msg),
		a2a.NewArtifactUpdateEvent(task, "a", a2a.NewTextPart("chunk")),
	}
	for _, ev := range events {
		want, err := json.Marshal(a2a.StreamResponse{Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		w, err := wrapEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%T:\n got %s\nwant %s", ev, got, want)
		}
		var sr a2a.StreamResponse
		if err := json.Unmarshal(want, &sr); err != nil {
			t.Fatal(err)
		}
		var back streamEvent
		if err := json.Unmarshal(want, &back); err != nil {
			t.Fatal(err)
		}
		ev2, err := back.event()
		if err != nil || !reflect.DeepEqual(ev2, sr.Event) {
			t.Errorf("%T decoded as %#v (%v), a2a-go: %#v", ev, ev2, err, sr.Event)
		}
	}
	for _, bad := range []string{`{}`, `{"task":{"id":"t"},"message":{"messageId":"m"}}`, `{"other":1}`} {
		var sr a2a.StreamResponse
		var w streamEvent
		_, err := w.event()
		if json.Unmarshal([]byte(bad), &w) == nil {
			_, err = w.event()
		}
		if json.Unmarshal([]byte(bad), &sr) == nil || err == nil {
			t.Errorf("%s: a2a-go and the SDK disagree (the SDK: %v)", bad, err)
		}
	}
	if _, err := wrapEvent(nil); err == nil {
		t.Error("wrapEvent(nil) accepted")
	}
}

// DecodeResponse reads a JSON-RPC response as a2a-go's decoder does: the same event out of every
// event type, the error object as *RPCError, and the same inputs refused.
func TestDecodeResponseMatchesA2AGo(t *testing.T) {
	task := &a2a.Task{ID: "t", ContextID: "c", Status: a2a.TaskStatus{State: a2a.TaskStateWorking}}
	msg := a2a.NewMessageForTask(a2a.MessageRoleAgent, task, a2a.NewTextPart("x"))
	for _, ev := range []a2a.Event{
		msg,
		&a2a.Task{ID: "t", ContextID: "c", Status: a2a.TaskStatus{State: a2a.TaskStateCompleted}, History: []*a2a.Message{msg}},
		a2a.NewStatusUpdateEvent(task, a2a.TaskStateCompleted, nil),
		a2a.NewArtifactUpdateEvent(task, "a", a2a.NewTextPart("chunk")),
	} {
		result, err := json.Marshal(a2a.StreamResponse{Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		payload := append(append([]byte(`{"jsonrpc":"2.0","id":7,"result":`), result...), '}')
		var env struct {
			Result a2a.StreamResponse `json:"result"`
		}
		if err := json.Unmarshal(payload, &env); err != nil {
			t.Fatal(err)
		}
		got, err := DecodeResponse(payload)
		if err != nil || !reflect.DeepEqual(got, env.Result.Event) {
			t.Errorf("%T decoded as %#v (%v), a2a-go: %#v", ev, got, err, env.Result.Event)
		}
	}
	_, err := DecodeResponse([]byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"no such task"}}`))
	var rpcErr *RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != -32001 || rpcErr.Message != "no such task" {
		t.Errorf("an error response: %v", err)
	}
	for _, bad := range []string{`{"jsonrpc":"2.0","id":7}`, `{"jsonrpc":"2.0","id":7,"result":{"other":1}}`, `not json`} {
		if ev, err := DecodeResponse([]byte(bad)); err == nil {
			t.Errorf("%s accepted as %#v", bad, ev)
		}
	}
}
