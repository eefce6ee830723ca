package conversation

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

func TestWithinCeilings(t *testing.T) {
	i32 := func(v int32) *int32 { return &v }
	d := func(s string) *metav1.Duration { x, _ := time.ParseDuration(s); return &metav1.Duration{Duration: x} }
	c := &v1alpha1.PolicyCeilings{MaxContextIdleTTL: d("1h"), MaxContextMaxAge: d("24h"), MaxInputRequiredTimeout: d("2h"),
		MaxActiveContextsPerAgent: i32(100), MaxConcurrentTasksPerContext: i32(4), MaxHistoryBytesPerContext: i32(4096)}

	// Asking for more than the ceilings: the ceilings apply, and each excess is named.
	greedy, err := NewPolicy(&v1alpha1.ConversationPolicySpec{ContextIdleTTL: d("720h"), ContextMaxAge: d("8760h"),
		InputRequiredTimeout: d("720h"), MaxActiveContextsPerAgent: 1000000, MaxConcurrentTasksPerContext: 1000,
		History: &v1alpha1.HistorySpec{MaxBytesPerContext: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	got, over := greedy.Within(c)
	if got.IdleTTL != time.Hour || got.MaxAge != 24*time.Hour || got.InputRequiredTimeout != 2*time.Hour ||
		got.MaxActiveContextsPerAgent != 100 || got.MaxConcurrentTasksPerContext != 4 || got.MaxHistoryBytes != 4096 {
		t.Errorf("bounded policy = %+v", got)
	}
	if len(over) != 6 || !strings.Contains(strings.Join(over, "; "), "maxActiveContextsPerAgent 1000000 exceeds the ceiling 100") {
		t.Errorf("excess = %v", over)
	}

	// Unlimited values take the ceiling silently; values below it stay.
	modest, _ := NewPolicy(&v1alpha1.ConversationPolicySpec{ContextIdleTTL: d("10m"), MaxConcurrentTasksPerContext: 1,
		History: &v1alpha1.HistorySpec{MaxBytesPerContext: 2048}})
	got, over = modest.Within(c)
	if len(over) != 0 || got.IdleTTL != 10*time.Minute || got.MaxConcurrentTasksPerContext != 1 ||
		got.MaxActiveContextsPerAgent != 100 || got.MaxAge != 24*time.Hour || got.InputRequiredTimeout != 2*time.Hour {
		t.Errorf("modest policy: %+v, excess %v", got, over)
	}
	if p, over := modest.Within(nil); p != modest || over != nil {
		t.Error("no ceilings must change nothing")
	}
}
