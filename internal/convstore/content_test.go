package convstore

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

func messageItem(t *testing.T, id, text string, role a2a.MessageRole) Item {
	t.Helper()
	m := a2a.NewMessage(role, a2a.NewTextPart(text))
	m.ID = id
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return Item{Kind: ItemMessage, Key: id, Data: b}
}

func artifactItem(t *testing.T, id, text string, appendChunk bool) Item {
	t.Helper()
	b, err := json.Marshal(&a2a.Artifact{ID: a2a.ArtifactID(id), Parts: a2a.ContentParts{a2a.NewTextPart(text)}})
	if err != nil {
		t.Fatal(err)
	}
	return Item{Kind: ItemArtifact, Key: id, Data: b, Append: appendChunk}
}

// texts renders a context's history as "task:key:text|text" strings.
func texts(t *testing.T, m *Memory, agent, ctxID string) []string {
	t.Helper()
	_, items := m.History(agent, ctxID)
	var out []string
	for _, it := range items {
		var parts []string
		var v struct {
			Parts []struct {
				Text string `json:"text"`
			} `json:"parts"`
		}
		if err := json.Unmarshal(it.Data, &v); err != nil {
			t.Fatal(err)
		}
		for _, p := range v.Parts {
			parts = append(parts, p.Text)
		}
		out = append(out, fmt.Sprintf("%s:%s:%s", it.TaskID, it.Key, strings.Join(parts, "|")))
	}
	return out
}

func historyFor(t *testing.T, m *Memory) map[string][]*Item {
	t.Helper()
	out := map[string][]*Item{}
	for _, a := range m.Agents() {
		st, _ := m.agent(a)
		for id, h := range st.hist {
			out[a+"/"+id] = h.items
		}
		st.mu.Unlock()
	}
	return out
}

// TestHistoryContent: history mode Messages keeps each task's messages and
// artifacts as small records, within the per-context byte bound (oldest
// first), drops them with their task or context, and recovers them record
// for record, on bbolt and on Redis.
func TestHistoryContent(t *testing.T) {
	for _, jk := range journals(t) {
		t.Run(jk.name, func(t *testing.T) {
			j, reopen := jk.open(t)
			m := NewMemory(j, true)
			p := conversation.DefaultPolicy()
			p.History = v1alpha1.HistoryMessages
			p.HistoryTasksPerContext = 2
			const agent = "o/u/a"

			d := mustDecide(t, m, agent, p, t0, send("T1", "C", "u1", "D1"), conversation.KindNewContext)
			_ = d
			// The request's message is kept with the accepted task (same
			// commit as the decision).
			if _, tk, err := m.Decide(agent, p, t0, send("T1", "C", "u1", "D1b"), messageItem(t, "u1", "hello", a2a.MessageRoleUser)); err != nil || tk.Wait(context.Background()) != nil {
				t.Fatal(err)
			}
			obs := func(ev conversation.Event, items ...Item) {
				t.Helper()
				_, tk, err := m.Observe(agent, p, t0, ev, items...)
				if err == nil {
					err = tk.Wait(context.Background())
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			obs(status("T1", "D1", a2a.TaskStateWorking), messageItem(t, "a1", "working", a2a.MessageRoleAgent), artifactItem(t, "art", "part1", false))
			// A chunk with append=true extends the artifact; a message
			// seen twice (task snapshot) is kept once.
			obs(conversation.Event{Kind: conversation.EventArtifact, TaskID: "T1", Correlation: []byte("D1")}, artifactItem(t, "art", "part2", true))
			obs(status("T1", "D1", a2a.TaskStateCompleted), messageItem(t, "a1", "working", a2a.MessageRoleAgent), messageItem(t, "a2", "done", a2a.MessageRoleAgent))
			if got, want := texts(t, m, agent, "C"), []string{"T1:u1:hello", "T1:a1:working", "T1:art:part1|part2", "T1:a2:done"}; !reflect.DeepEqual(got, want) {
				t.Fatalf("history %v, want %v", got, want)
			}

			// The byte bound drops the oldest items first.
			small := p
			small.MaxHistoryBytes = 400
			for i := range 6 {
				it := messageItem(t, fmt.Sprintf("u%d", 10+i), strings.Repeat("x", 60), a2a.MessageRoleUser)
				// Retries with fresh correlation data are forwarded: their items are kept.
				if _, tk, err := m.Decide(agent, small, t0, send("T2", "C", "u2", fmt.Sprintf("D2-%d", i)), it); err != nil || tk.Wait(context.Background()) != nil {
					t.Fatal(err)
				}
			}
			_, items := m.History(agent, "C")
			total := 0
			for _, it := range items {
				total += len(it.Data)
			}
			if total > 400 || len(items) == 0 || items[len(items)-1].Key != "u15" || items[0].TaskID == "T1" && items[0].Key == "u1" {
				t.Fatalf("bounded history: %d bytes in %d items, first %s last %s", total, len(items), items[0].Key, items[len(items)-1].Key)
			}
			// One item bigger than the whole bound is not kept.
			huge := messageItem(t, "huge", strings.Repeat("y", 500), a2a.MessageRoleUser)
			if _, tk, err := m.Decide(agent, small, t0, send("T2", "C", "u2", "D2-huge"), huge); err != nil || tk.Wait(context.Background()) != nil {
				t.Fatal(err)
			}
			if _, after := m.History(agent, "C"); len(after) != len(items) {
				t.Fatalf("an oversized item changed the history: %d → %d items", len(items), len(after))
			}

			// Summaries mode keeps none.
			mustDecide(t, m, agent, conversation.DefaultPolicy(), t0, send("S1", "CS", "s1", "E1"), conversation.KindNewContext)
			if _, tk, err := m.Decide(agent, conversation.DefaultPolicy(), t0, send("S1", "CS", "s1", "E1b"), messageItem(t, "s1", "x", a2a.MessageRoleUser)); err != nil || tk.Wait(context.Background()) != nil {
				t.Fatal(err)
			}
			if _, it := m.History(agent, "CS"); len(it) != 0 {
				t.Fatalf("summaries mode kept %d items", len(it))
			}

			// Recovery rebuilds the content record for record.
			want := historyFor(t, m)
			wantState := snapshot(m)
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			j2 := reopen()
			m2 := NewMemory(j2, true)
			if err := m2.Recover(context.Background(), "", nil); err != nil {
				t.Fatal(err)
			}
			if got := historyFor(t, m2); !reflect.DeepEqual(got, want) {
				t.Fatalf("recovered history differs:\n got %v\nwant %v", got, want)
			}
			if got := snapshot(m2); !reflect.DeepEqual(got, wantState) {
				t.Fatalf("recovered state differs")
			}
			if i, b := m2.HistoryStats(); i != len(want[agent+"/C"]) || b == 0 {
				t.Fatalf("stats %d items %d bytes", i, b)
			}

			// Evicting a finished task (history bound of 2 tasks) drops
			// its content; expiry drops the context's, in the store too.
			obs2 := func(ev conversation.Event) {
				t.Helper()
				if _, tk, err := m2.Observe(agent, p, t0, ev); err != nil || tk.Wait(context.Background()) != nil {
					t.Fatal(err)
				}
			}
			obs2(status("T2", "D2", a2a.TaskStateCompleted))
			mustDecide(t, m2, agent, p, t0, send("T3", "C", "u3", "D3"), conversation.KindNewTask)
			for _, it := range historyFor(t, m2)[agent+"/C"] {
				if it.TaskID == "T1" {
					t.Fatalf("content of evicted task T1 still held: %+v", it)
				}
			}
			swept, tk := m2.Sweep(func(string) conversation.Policy { return p }, t0.Add(p.IdleTTL+time.Minute))
			if err := tk.Wait(context.Background()); err != nil || len(swept) == 0 {
				t.Fatalf("sweep %v %v", swept, err)
			}
			if _, it := m2.History(agent, "C"); len(it) != 0 {
				t.Fatalf("expired context kept %d items", len(it))
			}
			_ = j2.Close()
			j3 := reopen()
			defer j3.Close()
			if err := j3.Load(context.Background(), agent, func(_ string, c *conversation.Context, items []*Item) error {
				if len(items) != 0 {
					return fmt.Errorf("context %s has %d history records after expiry", c.ID, len(items))
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTaskRecordVersions: the continuation hint and the agent's ids survive a
// round trip, and version 1 records (before them) still decode.
func TestTaskRecordVersions(t *testing.T) {
	tk := &conversation.Task{ID: "T1", State: a2a.TaskStateInputRequired, CreatedAt: t0, UpdatedAt: t0, WaitingSince: t0,
		MessageID: "m1", Seq: 3, AgentTaskID: "agent-T", AgentContextID: "agent-C",
		Continuation: &conversation.Continuation{ExpectedInput: "approval", ResumeScope: "same_task", AcceptedHistoryDigest: "sha256:00"}}
	got, err := decodeTask("T1", encodeTask(tk))
	if err != nil || !reflect.DeepEqual(got, tk) {
		t.Fatalf("round trip %+v %v", got, err)
	}
	// A version 1 record: the same layout up to Notify.
	v1 := encodeTask(&conversation.Task{ID: "T1", State: a2a.TaskStateWorking, MessageID: "m1"})
	v1 = v1[:len(v1)-3] // drop the hint flag and the two empty ids
	v1[0] = 1
	old, err := decodeTask("T1", v1)
	if err != nil || old.State != a2a.TaskStateWorking || old.MessageID != "m1" || old.Continuation != nil {
		t.Fatalf("v1 record: %+v %v", old, err)
	}
}
