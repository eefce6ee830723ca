package convservice

import (
	"encoding/json"
	"fmt"

	a2alegacy "github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2acompat/a2av0"

	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// History content (policy history mode Messages): what the service keeps of
// each task is the requester's messages and the agent's messages and
// artifacts, as A2A v1.0 JSON, in the requester's ids. A2A v1.0 content is
// kept as the peer sent it (it is re-encoded by a2a-go when served); v0.3
// content is converted with a2a-go's compatibility layer.

// requestItems is the history item of a send request: its message.
func requestItems(payload []byte, dialect a2amqtt.Dialect, messageID string) ([]convstore.Item, error) {
	raw, err := rawRequestMessage(payload)
	if err != nil {
		return nil, err
	}
	if dialect == a2amqtt.DialectV03 {
		m, err := decodeMessage(raw, true)
		if err != nil {
			return nil, err
		}
		if raw, err = json.Marshal(m); err != nil {
			return nil, fmt.Errorf("request message: %w", err)
		}
	}
	return []convstore.Item{{Kind: convstore.ItemMessage, Key: messageID, Data: raw}}, nil
}

// replyItems are the history items of an agent's reply: the status message
// of a status update or task, an artifact (update), a direct message, and
// the artifacts and history of a Task result (messages the service already
// holds, such as the requester's, are not kept twice).
func replyItems(payload []byte, pr parsedReply) ([]convstore.Item, error) {
	if pr.v03 {
		return replyItemsV03(payload)
	}
	type taskContent struct {
		Status *struct {
			Message json.RawMessage `json:"message"`
		} `json:"status"`
		Artifacts []json.RawMessage `json:"artifacts"`
		History   []json.RawMessage `json:"history"`
	}
	var env struct {
		Result *struct {
			taskContent
			StatusUpdate *struct {
				Status struct {
					Message json.RawMessage `json:"message"`
				} `json:"status"`
			} `json:"statusUpdate"`
			ArtifactUpdate *struct {
				Artifact json.RawMessage `json:"artifact"`
				Append   bool            `json:"append"`
			} `json:"artifactUpdate"`
			Task    *taskContent    `json:"task"`
			Message json.RawMessage `json:"message"`
		} `json:"result"`
	}
	if err := json.Unmarshal(payload, &env); err != nil || env.Result == nil {
		return nil, err
	}
	var items []convstore.Item
	var errs error
	addMessage := func(raw json.RawMessage) {
		if len(raw) == 0 || string(raw) == "null" {
			return
		}
		var id struct {
			ID string `json:"messageId"`
		}
		if err := json.Unmarshal(raw, &id); err != nil || id.ID == "" {
			errs = fmt.Errorf("message without messageId in the reply")
			return
		}
		items = append(items, convstore.Item{Kind: convstore.ItemMessage, Key: id.ID, Data: raw})
	}
	addArtifact := func(raw json.RawMessage, appendChunk bool) {
		if len(raw) == 0 || string(raw) == "null" {
			return
		}
		var id struct {
			ID string `json:"artifactId"`
		}
		if err := json.Unmarshal(raw, &id); err != nil || id.ID == "" {
			errs = fmt.Errorf("artifact without artifactId in the reply")
			return
		}
		items = append(items, convstore.Item{Kind: convstore.ItemArtifact, Key: id.ID, Data: raw, Append: appendChunk})
	}
	task := func(t *taskContent) {
		for _, h := range t.History {
			addMessage(h)
		}
		if t.Status != nil {
			addMessage(t.Status.Message)
		}
		for _, a := range t.Artifacts {
			addArtifact(a, false)
		}
	}
	r := env.Result
	switch {
	case r.StatusUpdate != nil:
		addMessage(r.StatusUpdate.Status.Message)
	case r.ArtifactUpdate != nil:
		addArtifact(r.ArtifactUpdate.Artifact, r.ArtifactUpdate.Append)
	case r.Task != nil:
		task(r.Task)
	case len(r.Message) > 0:
		addMessage(r.Message)
	default:
		task(&r.taskContent)
	}
	return items, errs
}

// replyItemsV03 converts an A2A v0.3 reply's result to v1.0 and takes its
// content.
func replyItemsV03(payload []byte) ([]convstore.Item, error) {
	var env struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(payload, &env); err != nil || len(env.Result) == 0 {
		return nil, err
	}
	old, err := a2alegacy.UnmarshalEventJSON(env.Result)
	if err != nil {
		return nil, fmt.Errorf("A2A v0.3 reply: %w", err)
	}
	ev, err := a2av0.ToV1Event(old)
	if err != nil {
		return nil, fmt.Errorf("A2A v0.3 reply: %w", err)
	}
	var items []convstore.Item
	addMessage := func(m *a2a.Message) error {
		if m == nil || m.ID == "" {
			return nil
		}
		b, err := json.Marshal(m)
		if err == nil {
			items = append(items, convstore.Item{Kind: convstore.ItemMessage, Key: m.ID, Data: b})
		}
		return err
	}
	addArtifact := func(a *a2a.Artifact, appendChunk bool) error {
		if a == nil || a.ID == "" {
			return nil
		}
		b, err := json.Marshal(a)
		if err == nil {
			items = append(items, convstore.Item{Kind: convstore.ItemArtifact, Key: string(a.ID), Data: b, Append: appendChunk})
		}
		return err
	}
	switch v := ev.(type) {
	case *a2a.Message:
		err = addMessage(v)
	case *a2a.TaskStatusUpdateEvent:
		err = addMessage(v.Status.Message)
	case *a2a.TaskArtifactUpdateEvent:
		err = addArtifact(v.Artifact, v.Append)
	case *a2a.Task:
		for _, h := range v.History {
			if err = addMessage(h); err != nil {
				break
			}
		}
		if err == nil {
			err = addMessage(v.Status.Message)
		}
		for _, a := range v.Artifacts {
			if err == nil {
				err = addArtifact(a, false)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("A2A v0.3 reply content: %w", err)
	}
	return items, nil
}
