package policy

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func pol(name string, prio int32, age time.Duration, sel map[string]string) a2av1.ConversationPolicy {
	return a2av1.ConversationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-age))},
		Spec: a2av1.ConversationPolicySpec{
			Priority:      prio,
			AgentSelector: metav1.LabelSelector{MatchLabels: sel},
		},
	}
}

func TestMatching(t *testing.T) {
	deleting := pol("deleting", 100, time.Hour, nil)
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	badSelector := pol("bad", 100, time.Hour, nil)
	badSelector.Spec.AgentSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}

	cases := []struct {
		name     string
		policies []a2av1.ConversationPolicy
		labels   map[string]string
		want     []string
	}{
		{"none", nil, map[string]string{"a": "1"}, []string{}},
		{"selector misses", []a2av1.ConversationPolicy{pol("p", 0, 0, map[string]string{"a": "2"})}, map[string]string{"a": "1"}, []string{}},
		{"empty selector selects all", []a2av1.ConversationPolicy{pol("p", 0, 0, nil)}, map[string]string{"a": "1"}, []string{"p"}},
		{"priority wins over age", []a2av1.ConversationPolicy{pol("old", 0, time.Hour, nil), pol("high", 5, 0, nil)}, nil, []string{"high", "old"}},
		{"older wins on equal priority", []a2av1.ConversationPolicy{pol("new", 1, 0, nil), pol("old", 1, time.Hour, nil)}, nil, []string{"old", "new"}},
		{"name breaks full tie", []a2av1.ConversationPolicy{pol("b", 1, 0, nil), pol("a", 1, 0, nil)}, nil, []string{"a", "b"}},
		{"deleting and invalid select nothing", []a2av1.ConversationPolicy{deleting, badSelector, pol("ok", 0, 0, nil)}, nil, []string{"ok"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Names(Matching(tc.policies, tc.labels))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Matching = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSelectsReportsInvalidSelector(t *testing.T) {
	p := pol("bad", 0, 0, nil)
	p.Spec.AgentSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}
	if _, err := Selects(&p, nil); err == nil {
		t.Fatal("expected an error for an invalid selector")
	}
}
