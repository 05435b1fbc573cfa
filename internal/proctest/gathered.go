package proctest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the value of series, a counter or a gauge, in what g
// gathers, failing t when g has no such series: the in-process Scrape,
// for a registry a test holds. series is written as the text exposition
// writes it, e.g. sluice_jwt_tokens_total{result="valid"}, its labels in
// the order g gives them (client_golang sorts them by name).
func Metric(t testing.TB, g prometheus.Gatherer, series string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := f.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case name != series:
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no counter or gauge %s", series)
	return 0
}
