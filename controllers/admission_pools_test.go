package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// warnings records the API server's Warning headers.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}

// TestPoolsWarnedAtAdmission applies config/admission as the installs on Mosquitto ship it
// (config/quickstart, the chart's admission.warnPoolsOnMosquitto): an Agent with a poolID is
// admitted with a warning that names the pool and why Mosquitto cannot serve it; an Agent
// without one gets no warning.
func TestPoolsWarnedAtAdmission(t *testing.T) {
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join("..", "config", "admission", "pools-on-mosquitto.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := k8s.Create(ctx, u); err != nil {
			t.Fatalf("create %s: %v", u.GetKind(), err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), u) })
	}
	w := &warnings{}
	cfg := rest.CopyConfig(restCfg)
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	agent := func(name, pool string) *a2av1.Agent {
		a := &a2av1.Agent{}
		a.Namespace, a.Name = ns, name
		a.Spec = a2av1.AgentSpec{OrgID: "acme", UnitID: "pools", PoolID: pool, Card: a2av1.AgentCardSpec{Name: name, Description: "d"}}
		return a
	}
	// The API server compiles a new policy within a second or two: dry runs until it warns.
	eventually(t, "the pool warning at admission", func() error {
		if err := c.Create(ctx, agent("probe", "planners"), client.DryRunAll); err != nil {
			return err
		}
		if got := w.take(); len(got) != 1 || !strings.Contains(got[0], "spec.poolID planners") || !strings.Contains(got[0], "Mosquitto") {
			return fmt.Errorf("warnings %q", got)
		}
		return nil
	})
	if err := c.Create(ctx, agent("planner", "planners")); err != nil {
		t.Fatalf("an Agent with a pool is admitted (warned, not refused): %v", err)
	}
	if got := w.take(); len(got) != 1 || !strings.Contains(got[0], "shared subscriptions") {
		t.Fatalf("create with a pool: warnings %q", got)
	}
	if err := c.Create(ctx, agent("solo", "")); err != nil {
		t.Fatal(err)
	}
	if got := w.take(); len(got) != 0 {
		t.Fatalf("an Agent without a pool was warned: %q", got)
	}
}
