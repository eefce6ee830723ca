package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
)

// TestAdmissionRejectsBadManifests checks that every validation rule of the CRDs rejects what it
// should, at admission, with a message that names the field and the rule.
func TestAdmissionRejectsBadManifests(t *testing.T) {
	ns := newNamespace(t)
	agent := func(spec string) string {
		return "apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: bad\nspec:\n" + spec
	}
	card := "  card: {name: agent, description: d}\n"
	policy := func(spec string) string {
		return "apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: bad\nspec:\n  agentSelector: {}\n" + spec
	}
	cases := []struct {
		name     string
		manifest string
		want     []string
	}{
		{"org with slash", agent("  orgID: a/b\n  unitID: u\n" + card), []string{"spec.orgID", "should match '^[A-Za-z0-9_.-]+$'"}},
		{"unit with MQTT wildcard", agent("  orgID: o\n  unitID: '+'\n" + card), []string{"spec.unitID", "should match"}},
		{"agentID with hash", agent("  orgID: o\n  unitID: u\n  agentID: 'a#'\n" + card), []string{"spec.agentID", "should match"}},
		{"empty org", agent("  orgID: ''\n  unitID: u\n" + card), []string{"spec.orgID", "at least 1 chars long"}},
		{"org too long", agent("  orgID: " + strings.Repeat("o", 65) + "\n  unitID: u\n" + card), []string{"spec.orgID", "may not be more than 64"}},
		{"missing unit", agent("  orgID: o\n" + card), []string{"spec.unitID", "Required value"}},
		{"missing card", agent("  orgID: o\n  unitID: u\n"), []string{"spec.card", "Required value"}},
		{"bad pool id", agent("  orgID: o\n  unitID: u\n  poolID: 'p/1'\n" + card), []string{"spec.poolID", "should match"}},
		{"unknown caller scope", agent("  orgID: o\n  unitID: u\n" + card + "  callers: {scope: Everyone}\n"), []string{"spec.callers.scope", "Unsupported value: \"Everyone\"", "SameUnit"}},
		{"duplicate skill ids", agent("  orgID: o\n  unitID: u\n  card:\n    name: agent\n    description: d\n    skills:\n    - {id: s, name: a, description: a}\n    - {id: s, name: b, description: b}\n"), []string{"spec.card.skills[1]", "Duplicate value"}},
		{"documentation URL not a URL", agent("  orgID: o\n  unitID: u\n  card: {name: agent, description: d, documentationURL: 'not a url'}\n"), []string{"spec.card.documentationURL", "must be an absolute URL"}},
		{"extension uri not a URL", agent("  orgID: o\n  unitID: u\n  card:\n    name: agent\n    description: d\n    capabilities: {extensions: [{uri: 'continuation'}]}\n"), []string{"spec.card.capabilities.extensions[0].uri", "extension uri must be an absolute URL"}},
		{"duplicate extension uris", agent("  orgID: o\n  unitID: u\n  card:\n    name: agent\n    description: d\n    capabilities: {extensions: [{uri: 'https://x.dev/e'}, {uri: 'https://x.dev/e'}]}\n"), []string{"spec.card.capabilities.extensions[1]", "Duplicate value"}},
		{"workload with bad replicas", agent("  orgID: o\n  unitID: u\n" + card + "  workload:\n    replicas: -1\n    template: {spec: {containers: [{name: c, image: i}]}}\n"), []string{"spec.workload.replicas", "greater than or equal to 0"}},
		{"workload with replicas sharing one client ID", agent("  orgID: o\n  unitID: u\n" + card + "  workload:\n    replicas: 2\n    template: {spec: {containers: [{name: c, image: i}]}}\n"), []string{"spec.workload.replicas", "replicas must be 0 or 1", "poolID"}},
		{"reserved org", agent("  orgID: a2a-fleet\n  unitID: system\n  agentID: conversation-service\n" + card), []string{"spec.orgID", "orgID a2a-fleet is reserved"}},
		{"workload container without name", agent("  orgID: o\n  unitID: u\n" + card + "  workload:\n    template: {spec: {containers: [{image: i}]}}\n"), []string{"spec.workload.template.spec.containers[0].name", "Required value"}},

		{"zero idle TTL", policy("  contextIdleTTL: 0s\n"), []string{"spec.contextIdleTTL", "contextIdleTTL must be between 1s and 720h"}},
		{"negative idle TTL", policy("  contextIdleTTL: -5m\n"), []string{"spec.contextIdleTTL", "must be a duration such as"}},
		{"idle TTL not a duration", policy("  contextIdleTTL: soon\n"), []string{"spec.contextIdleTTL", "must be a duration such as"}},
		{"idle TTL too long", policy("  contextIdleTTL: 1000h\n"), []string{"spec.contextIdleTTL", "between 1s and 720h"}},
		{"max age below idle TTL", policy("  contextIdleTTL: 1h\n  contextMaxAge: 10m\n"), []string{"spec", "contextMaxAge must be at least contextIdleTTL"}},
		{"zero input-required timeout", policy("  inputRequiredTimeout: 0s\n"), []string{"spec.inputRequiredTimeout", "between 1s and 720h"}},
		{"negative concurrency", policy("  maxConcurrentTasksPerContext: -1\n"), []string{"spec.maxConcurrentTasksPerContext", "greater than or equal to 0"}},
		{"concurrency too high", policy("  maxConcurrentTasksPerContext: 1001\n"), []string{"spec.maxConcurrentTasksPerContext", "less than or equal to 1000"}},
		{"negative active contexts", policy("  maxActiveContextsPerAgent: -3\n"), []string{"spec.maxActiveContextsPerAgent", "greater than or equal to 0"}},
		{"zero history", policy("  historyTasksPerContext: 0\n"), []string{"spec.historyTasksPerContext", "greater than or equal to 1"}},
		{"priority out of range", policy("  priority: 5000\n"), []string{"spec.priority", "less than or equal to 1000"}},
		{"org named like the reserved one in capitals", agent("  orgID: A2A-FLEET\n  unitID: u\n" + card), []string{"spec.orgID", "orgID a2a-fleet is reserved", "in any case"}},
		{"unit of dots only", agent("  orgID: o\n  unitID: '..'\n" + card), []string{"spec.unitID", "dots only"}},
		{"org of one dot", agent("  orgID: '.'\n  unitID: u\n" + card), []string{"spec.orgID", "dots only"}},
		{"agentID of dots", agent("  orgID: o\n  unitID: u\n  agentID: '...'\n" + card), []string{"spec.agentID", "dots only"}},
		{"pool of dots", agent("  orgID: o\n  unitID: u\n  poolID: '..'\n" + card), []string{"spec.poolID", "dots only"}},
		{"caller selector with an unknown operator", agent("  orgID: o\n  unitID: u\n" + card + "  callers: {from: [{agentSelector: {matchExpressions: [{key: role, operator: Equals, values: [a]}]}}]}\n"),
			[]string{"spec.callers.from[0].agentSelector", "each with operator In or NotIn and values"}},
		{"caller selector In without values", agent("  orgID: o\n  unitID: u\n" + card + "  callers: {from: [{agentSelector: {}, namespaceSelector: {matchExpressions: [{key: team, operator: In}]}}]}\n"),
			[]string{"spec.callers.from[0].namespaceSelector", "each with operator In or NotIn and values"}},
		{"caller selector Exists with values", agent("  orgID: o\n  unitID: u\n" + card + "  callers: {from: [{agentSelector: {matchExpressions: [{key: role, operator: Exists, values: [x]}]}}]}\n"),
			[]string{"spec.callers.from[0].agentSelector", "Exists or DoesNotExist without values"}},
		{"card text larger than any Tenant allows", agent("  orgID: o\n  unitID: u\n  card:\n    name: agent\n    description: d\n    skills:\n" + bigSkills(64)),
			[]string{"spec.card", "more than 256 KiB"}},
		{"policy selector with a bad operator", "apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: bad\nspec:\n  agentSelector: {matchExpressions: [{key: a, operator: Gt, values: ['1']}]}\n",
			[]string{"spec.agentSelector", "each with operator In or NotIn"}},
		{"grant selector In without values", "apiVersion: a2a.fleet.dev/v1alpha1\nkind: AgentGrant\nmetadata:\n  name: bad\nspec:\n  from: [{namespace: x}]\n  to: [{kind: Callers, agentSelector: {matchExpressions: [{key: a, operator: NotIn}]}}]\n",
			[]string{"spec.to[0].agentSelector", "each with operator In or NotIn and values"}},
		{"missing selector", "apiVersion: a2a.fleet.dev/v1alpha1\nkind: ConversationPolicy\nmetadata:\n  name: bad\nspec: {}\n", []string{"spec.agentSelector", "Required value"}},
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
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

// bigSkills is n skills of 4 KiB descriptions and 16 KiB of examples each (YAML list items).
func bigSkills(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "    - id: s%d\n      name: s\n      description: %s\n      examples: [%s]\n", i, strings.Repeat("d", 4096),
			strings.TrimSuffix(strings.Repeat(strings.Repeat("e", 1024)+", ", 16), ", "))
	}
	return b.String()
}

// A card just under the CEL bound is accepted at admission (the operator then checks the
// Tenant's maxCardBytes): the rule's cost fits the API server's budget and does not refuse
// everything.
func TestAdmissionAcceptsLargeButBoundedCards(t *testing.T) {
	ns := newNamespace(t)
	m := "apiVersion: a2a.fleet.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: big\nspec:\n  orgID: o\n  unitID: u\n  card:\n    name: agent\n    description: d\n    skills:\n" + bigSkills(11)
	if err := applyYAML(ns, m); err != nil {
		t.Fatalf("a card with ~225 KiB of text was refused: %v", err)
	}
}

func TestAdmissionLongNameNeedsAgentID(t *testing.T) {
	ns := newNamespace(t)
	long := strings.Repeat("n", 70)
	manifest := agentManifest(long, "o", "u", nil, "")
	err := applyYAML(ns, manifest)
	if err == nil || !strings.Contains(err.Error(), "metadata.name is longer than 64 characters: set spec.agentID") {
		t.Fatalf("want the agentID-default rule to reject a 70-char name, got %v", err)
	}
	if err := applyYAML(ns, agentManifest(long, "o", "u", nil, "  agentID: short\n")); err != nil {
		t.Fatalf("a long name with an explicit agentID must be accepted: %v", err)
	}
}

func TestAdmissionIdentityIsImmutable(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	if err := applyYAML(ns, agentManifest("fixed", "acme", "u", nil, "")); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(spec map[string]any)
		want   string
	}{
		{"orgID", func(s map[string]any) { s["orgID"] = "other" }, "orgID is immutable"},
		{"unitID", func(s map[string]any) { s["unitID"] = "other" }, "unitID is immutable"},
		{"agentID set later", func(s map[string]any) { s["agentID"] = "fixed" }, "agentID is immutable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The controller writes finalizer and status concurrently: retry only on version conflicts.
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				u := getUnstructuredAgent(t, ns, "fixed")
				tc.mutate(u.Object["spec"].(map[string]any))
				return k8s.Update(ctx, u)
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("update error = %v, want %q", err, tc.want)
			}
		})
	}
	// Other fields stay mutable.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u := getUnstructuredAgent(t, ns, "fixed")
		u.Object["spec"].(map[string]any)["poolID"] = "pool-a"
		return k8s.Update(ctx, u)
	}); err != nil {
		t.Fatalf("a mutable field was refused: %v", err)
	}
}
