package deploy

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/proctest"
)

// alertRules is deploy/prometheus/alerts.yaml as the tests read it.
type alertRules struct {
	Groups []struct {
		Rules []struct {
			Alert       string
			Expr        string
			Labels      map[string]string
			Annotations map[string]string
		}
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestPrometheusAlerts runs promtool's checks and unit tests of the alerts,
// and checks that every alert has a severity, a summary and a runbook-like
// description, and is shown firing by at least one unit test.
func TestPrometheusAlerts(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool", "prometheus")
	dir := filepath.Join(root, "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		if out, err := proctest.Run(dir, nil, promtool, args...); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}

	var rules alertRules
	readYAML(t, filepath.Join(dir, "alerts.yaml"), &rules)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string
				ExpAlerts []any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		}
	}
	readYAML(t, filepath.Join(dir, "alerts_test.yaml"), &tests)
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.Alertname] = fires[a.Alertname] || len(a.ExpAlerts) > 0
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Labels["severity"] != "warning" && r.Labels["severity"] != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || len(r.Annotations["description"]) < 150 {
				t.Errorf("%s: want a summary and a description that says what to do", r.Alert)
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no unit test shows it firing", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts in alerts.yaml")
	}
}
