package main

import (
	"encoding/json"
	"os"
	"testing"
)

// Every panel of the committed dashboard is one the page draws (a row, a stat, a time series
// with at least one query), so make dashboard-screenshot does not stop at an unknown panel.
func TestTheDashboardsPanelsAreDrawn(t *testing.T) {
	raw, err := os.ReadFile("../../config/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	panels := flatten(d.Panels)
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	for _, p := range panels {
		switch p.Type {
		case "row":
		case "stat", "timeseries":
			if len(p.Targets) == 0 || p.Targets[0].Expr == "" {
				t.Errorf("panel %q has no query", p.Title)
			}
		default:
			t.Errorf("panel %q: type %q is not drawn", p.Title, p.Type)
		}
		if p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q has no size: %+v", p.Title, p.GridPos)
		}
	}
}

func TestLegend(t *testing.T) {
	labels := map[string]string{"controller": "agent", "result": "success"}
	if got := legend("", labels); got != "controller=agent, result=success" {
		t.Errorf("legend without a format: %q", got)
	}
	if got := legend("{{controller}} ({{ result }})", labels); got != "agent (success)" {
		t.Errorf("legend with a format: %q", got)
	}
}
