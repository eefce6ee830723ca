package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// TestAdmissionOneLinePerMistake checks the exact answer of the API server to the mistakes a
// hand-written manifest makes most (issue 26): one line that names the field and says what to
// write, and nothing else (no "some validation rules were not checked", no CEL type-conversion
// error).
func TestAdmissionOneLinePerMistake(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name, manifest, want string
	}{
		{"missing orgID",
			"apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: no-org\nspec:\n  unitID: demo\n  card: {name: Echo, description: d}\n",
			`Agent.a2a.fleet.dev "no-org" is invalid: spec.orgID: Required value: orgID is required: the organization segment of the agent's identity ($a2a/v1/request/{orgID}/{unitID}/{agentID})`},
		{"missing unitID",
			"apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: no-unit\nspec:\n  orgID: acme\n  card: {name: Echo, description: d}\n",
			`Agent.a2a.fleet.dev "no-unit" is invalid: spec.unitID: Required value: unitID is required: the organizational-unit segment of the agent's identity ($a2a/v1/request/{orgID}/{unitID}/{agentID})`},
		{"idle TTL in words",
			"apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: words\nspec:\n  agentSelector: {}\n  contextIdleTTL: 30 minutes\n",
			`ConversationPolicy.a2a.fleet.dev "words" is invalid: spec.contextIdleTTL: Invalid value: "30 minutes": contextIdleTTL must be a duration such as 90s, 30m or 1h30m (units h, m, s, ms)`},
		{"idle TTL out of range",
			"apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: long\nspec:\n  agentSelector: {}\n  contextIdleTTL: 1000h\n",
			`ConversationPolicy.a2a.fleet.dev "long" is invalid: spec.contextIdleTTL: Invalid value: "1000h": contextIdleTTL must be between 1s and 720h`},
		{"max age in words",
			"apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: age\nspec:\n  agentSelector: {}\n  contextMaxAge: 1 day\n",
			`ConversationPolicy.a2a.fleet.dev "age" is invalid: spec.contextMaxAge: Invalid value: "1 day": contextMaxAge must be a duration such as 90s, 30m or 1h30m (units h, m, s, ms)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := applyYAML(ns, tc.manifest)
			if err == nil {
				t.Fatalf("manifest was accepted:\n%s", tc.manifest)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %T: %v", err, err)
			}
			if err.Error() != tc.want {
				t.Fatalf("admission error:\n got: %s\nwant: %s", err, tc.want)
			}
		})
	}
}

// TestCardDescriptionIsOptional: a manifest without spec.card.description is admitted (the
// published card's description is the name: internal/registration's BuildCard test).
func TestCardDescriptionIsOptional(t *testing.T) {
	ns := newNamespace(t)
	if err := applyYAML(ns, "apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: terse\nspec:\n  orgID: acme\n  unitID: demo\n  card: {name: Terse agent}\n"); err != nil {
		t.Fatalf("an Agent without card.description was refused: %v", err)
	}
}

// TestPolicySelectingNothingWarns: a policy whose selector matches no Agent is Ready=False
// (NoAgentsSelected) with a Warning event, and `kubectl get cpol` prints 0 in MATCHED and
// APPLIED (the server-side printer columns, read as kubectl reads them), not a blank.
func TestPolicySelectingNothingWarns(t *testing.T) {
	ns := newNamespace(t)
	if err := applyYAML(ns, "apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: typo\nspec:\n  agentSelector: {matchLabels: {tier: goldd}}\n"); err != nil {
		t.Fatal(err)
	}
	wantMsg := "agentSelector 'tier=goldd' matches no Agent in namespace " + ns + ": this policy governs nothing"
	eventually(t, "policy not ready", func() error {
		p := getPolicy(t, ns, "typo")
		if err := conditionIs(p.Status.Conditions, p.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonNoAgentsSelected); err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == a2av1.ConditionReady && c.Message != wantMsg {
				return fmt.Errorf("Ready message %q, want %q", c.Message, wantMsg)
			}
		}
		return nil
	})
	eventually(t, "warning event", func() error {
		var evs eventsv1.EventList
		if err := k8s.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "typo" && e.Reason == a2av1.ReasonNoAgentsSelected {
				if e.Type != "Warning" || e.Note != wantMsg {
					return fmt.Errorf("event %s %q, want Warning %q", e.Type, e.Note, wantMsg)
				}
				return nil
			}
		}
		return fmt.Errorf("no %s event", a2av1.ReasonNoAgentsSelected)
	})
	cells := printedColumns(t, ns, "typo")
	for _, col := range []string{"Matched", "Applied"} {
		if v, ok := cells[col]; !ok || fmt.Sprint(v) != "0" {
			t.Fatalf("column %s printed %v (present %v), want 0; row %v", col, v, ok, cells)
		}
	}
	if cells["Ready"] != "False" {
		t.Fatalf("column Ready printed %v, want False", cells["Ready"])
	}

	// An Agent with the label makes it Ready, and the event does not repeat.
	if err := applyYAML(ns, agentManifest("gold-agent", "acme", "u", map[string]string{"tier": "goldd"}, "")); err != nil {
		t.Fatal(err)
	}
	expectPolicyStatus(t, ns, "typo", policyView{matched: 1, applied: 1, names: []string{"gold-agent"}, conflicted: metav1.ConditionFalse})
}

// printedColumns asks the API server for the policy as a Table, as kubectl get does, and returns
// its cells by column name.
func printedColumns(t *testing.T, ns, name string) map[string]any {
	t.Helper()
	cfg := rest.CopyConfig(restCfg)
	cfg.GroupVersion = &schema.GroupVersion{Group: a2av1.GroupVersion.Group, Version: a2av1.GroupVersion.Version}
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	raw, err := rc.Get().Namespace(ns).Resource("conversationpolicies").Name(name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(context.Background()).Raw()
	if err != nil {
		t.Fatalf("get table: %v", err)
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("decode table: %v", err)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("table has %d rows", len(table.Rows))
	}
	cells := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		if i < len(table.Rows[0].Cells) && table.Rows[0].Cells[i] != nil {
			cells[c.Name] = table.Rows[0].Cells[i]
		}
	}
	return cells
}
