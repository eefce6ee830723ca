package convservice

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

func TestCallerLimiter(t *testing.T) {
	l := newCallerLimiter(10, 3, 20, 2)
	flood, quiet := a2amqtt.AgentRef{Org: "evil", Unit: "x", Agent: "flood"}, a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "console"}
	now := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		if ok, _, _ := l.allow(flood, now); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	ok, wait, answer := l.allow(flood, now)
	if ok || !answer || wait < 99*time.Millisecond || wait > 101*time.Millisecond {
		t.Fatalf("beyond the burst: allowed %v, answered %v, wait %s; want refused and answered, ~100ms (10/s)", ok, answer, wait)
	}
	// The refusals are answered up to a burst of their own, then dropped unanswered.
	answered := 1
	for range 10 {
		if _, _, a := l.allow(flood, now); a {
			answered++
		}
	}
	if answered != 3 {
		t.Fatalf("%d refusals answered at once, want the burst of 3", answered)
	}
	if ok, _, _ := l.allow(quiet, now); !ok {
		t.Fatal("another caller's bucket is not its own")
	}
	// The flooder's reads of its own history (were it a governed agent) have a budget of their
	// own: its empty caller bucket does not refuse them, and they are refused past theirs.
	own := bucketKey{ref: flood, budget: budgetAgentHistory}
	for i := range 2 {
		if ok, _, _ := l.allowOf(own, now); !ok {
			t.Fatalf("own history read %d refused with the caller bucket empty", i)
		}
	}
	if ok, wait, _ := l.allowOf(own, now); ok || wait < 49*time.Millisecond || wait > 51*time.Millisecond {
		t.Fatalf("own history read past its burst: allowed %v, wait %s; want refused, ~50ms (20/s)", ok, wait)
	}
	var ownData struct {
		Budget string  `json:"budget"`
		Rate   float64 `json:"rate"`
	}
	if e := l.rateLimitedErrorOf(own, time.Millisecond); json.Unmarshal(e.Data, &ownData) != nil || ownData.Budget != "agent_history" || ownData.Rate != 20 {
		t.Fatalf("own history refusal data %s", e.Data)
	}
	if ok, _, _ := l.allow(flood, now.Add(wait)); !ok {
		t.Fatal("refused after retry_after")
	}
	e := l.rateLimitedError(flood, 123456*time.Microsecond)
	var data struct {
		Kind       string  `json:"a2a_error"`
		RetryAfter float64 `json:"retry_after"`
	}
	if err := json.Unmarshal(e.Data, &data); err != nil || e.Code != CodeRateLimited || data.Kind != rpcerr.NameRateLimited || data.RetryAfter != 0.124 {
		t.Fatalf("error %d %s %+v (%v)", e.Code, e.Data, data, err)
	}
	// Idle callers are forgotten once their bucket is full again.
	l.allow(quiet, now.Add(2*pruneEvery))
	if _, kept := l.buckets[bucketKey{ref: flood}]; kept || len(l.buckets) != 1 {
		t.Fatalf("buckets after a prune: %v", l.buckets)
	}
	if ok, _, _ := newCallerLimiter(-1, 0, 1, 1).allow(flood, now); !ok {
		t.Fatal("a negative rate must mean no limit")
	}
	unlimitedHistory := newCallerLimiter(1, 1, -1, 0)
	for range 5 {
		if ok, _, _ := unlimitedHistory.allowOf(own, now); !ok {
			t.Fatal("a negative own-history rate must mean no limit on it")
		}
	}
}
