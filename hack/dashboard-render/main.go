// Command dashboard-render draws config/monitoring/grafana-dashboard.json's panels as one HTML
// page from a Prometheus's recorded data, for a headless browser to screenshot (make
// dashboard-screenshot writes docs/img/dashboard.png). It is not Grafana: it reads the
// dashboard's rows, stat and timeseries panels, their grid positions, PromQL targets, legend
// formats and units, runs each query against Prometheus's HTTP API (an instant query at the end
// of the range for a stat, a range query for a time series) and plots the answers with uPlot
// (npm "uplot", inlined into the page, so the page needs no network).
//
//	go run ./hack/dashboard-render -prometheus http://127.0.0.1:9090 -from 1700000000 -to 1700000600 \
//	    -uplot bin/dashboard-deps/node_modules/uplot/dist -o bin/dashboard.html
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// dashboard is the part of Grafana's dashboard model the page draws.
type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

// series is one line of a time series panel, or the value of a stat.
type series struct {
	Label  string     `json:"label"`
	Values []*float64 `json:"values"`
}

// drawn is a panel as the page draws it.
type drawn struct {
	Type, Title, Unit string
	X, Y, W, H        int
	Stat              string    // the stat's value, formatted
	Times             []float64 `json:",omitempty"`
	Series            []series  `json:",omitempty"`
	Queries           []string
	Err               string
}

type config struct {
	prometheus    string
	from, to      time.Time
	step          time.Duration
	dashboardFile string
	uplotDir      string
	out           string
}

func main() {
	var c config
	var from, to int64
	flag.StringVar(&c.prometheus, "prometheus", "http://127.0.0.1:9090", "the Prometheus whose recorded data to draw")
	flag.Int64Var(&from, "from", 0, "start of the range, Unix seconds (default: an hour before -to)")
	flag.Int64Var(&to, "to", 0, "end of the range, Unix seconds (default: now)")
	flag.DurationVar(&c.step, "step", 15*time.Second, "resolution of the range queries")
	flag.StringVar(&c.dashboardFile, "dashboard", "config/monitoring/grafana-dashboard.json", "the Grafana dashboard JSON")
	flag.StringVar(&c.uplotDir, "uplot", "bin/dashboard-deps/node_modules/uplot/dist", "uPlot's dist folder (uPlot.iife.min.js, uPlot.min.css)")
	flag.StringVar(&c.out, "o", "bin/dashboard.html", "the HTML page to write")
	flag.Parse()
	c.to = time.Now()
	if to != 0 {
		c.to = time.Unix(to, 0)
	}
	c.from = c.to.Add(-time.Hour)
	if from != 0 {
		c.from = time.Unix(from, 0)
	}
	if err := run(context.Background(), c); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard-render:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	raw, err := os.ReadFile(c.dashboardFile)
	if err != nil {
		return err
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("%s: %w", c.dashboardFile, err)
	}
	prom := &promClient{base: strings.TrimSuffix(c.prometheus, "/"), http: &http.Client{Timeout: 30 * time.Second}}
	version, err := prom.version(ctx)
	if err != nil {
		return err
	}
	var panels []drawn
	var withData int
	for _, p := range flatten(d.Panels) {
		dp, err := draw(ctx, prom, c, p)
		if err != nil {
			return err
		}
		if dp.Err == "" && (dp.Stat != "" || len(dp.Series) > 0) {
			withData++
		}
		panels = append(panels, dp)
	}
	js, err := os.ReadFile(filepath.Join(c.uplotDir, "uPlot.iife.min.js"))
	if err != nil {
		return fmt.Errorf("uPlot (npm ci in hack/dashboard-render): %w", err)
	}
	css, err := os.ReadFile(filepath.Join(c.uplotDir, "uPlot.min.css"))
	if err != nil {
		return err
	}
	data, err := json.Marshal(panels)
	if err != nil {
		return err
	}
	f, err := os.Create(c.out)
	if err != nil {
		return err
	}
	defer f.Close()
	err = page.Execute(f, map[string]any{
		"Title":      d.Title,
		"Panels":     panels,
		"Data":       template.JS(data),
		"UPlot":      template.JS(js),
		"UPlotCSS":   template.CSS(css),
		"Rows":       rows(panels),
		"From":       c.from.UTC().Format("2006-01-02 15:04:05"),
		"To":         c.to.UTC().Format("15:04:05 MST"),
		"Prometheus": version,
		"Source":     filepath.Base(c.dashboardFile),
	})
	if err != nil {
		return err
	}
	fmt.Printf("dashboard-render: %d panels (%d with data) from Prometheus %s, %s to %s, in %s\n",
		len(panels), withData, version, c.from.UTC().Format(time.RFC3339), c.to.UTC().Format(time.RFC3339), c.out)
	return f.Close()
}

// flatten lists the panels in grid order, a collapsed row's panels after the row.
func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		inner := p.Panels
		p.Panels = nil
		out = append(out, p)
		out = append(out, flatten(inner)...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].GridPos.Y != out[j].GridPos.Y {
			return out[i].GridPos.Y < out[j].GridPos.Y
		}
		return out[i].GridPos.X < out[j].GridPos.X
	})
	return out
}

// rows is the page's height in grid units.
func rows(ps []drawn) int {
	n := 0
	for _, p := range ps {
		n = max(n, p.Y+p.H)
	}
	return n
}

func draw(ctx context.Context, prom *promClient, c config, p panel) (drawn, error) {
	dp := drawn{Type: p.Type, Title: p.Title, Unit: p.FieldConfig.Defaults.Unit, X: p.GridPos.X, Y: p.GridPos.Y, W: p.GridPos.W, H: p.GridPos.H}
	for _, t := range p.Targets {
		dp.Queries = append(dp.Queries, t.Expr)
	}
	switch p.Type {
	case "row":
		return dp, nil
	case "stat":
		if len(p.Targets) == 0 {
			return dp, nil
		}
		res, err := prom.query(ctx, "/api/v1/query", url.Values{"query": {p.Targets[0].Expr}, "time": {unix(c.to)}})
		if err != nil {
			dp.Err = err.Error()
			return dp, nil
		}
		var total float64
		for _, r := range res {
			v, err := strconv.ParseFloat(fmt.Sprint(r.Value[1]), 64)
			if err == nil {
				total += v
			}
		}
		if len(res) > 0 {
			dp.Stat = format(total, dp.Unit)
		} else {
			dp.Stat = "no data"
		}
		return dp, nil
	case "timeseries":
		times := []float64{}
		for t := c.from; !t.After(c.to); t = t.Add(c.step) {
			times = append(times, float64(t.Unix()))
		}
		dp.Times = times
		for _, t := range p.Targets {
			res, err := prom.query(ctx, "/api/v1/query_range", url.Values{"query": {t.Expr}, "start": {unix(c.from)}, "end": {unix(c.to)}, "step": {strconv.FormatFloat(c.step.Seconds(), 'f', -1, 64)}})
			if err != nil {
				dp.Err = err.Error()
				return dp, nil
			}
			for _, r := range res {
				s := series{Label: legend(t.LegendFormat, r.Metric), Values: make([]*float64, len(times))}
				for _, pt := range r.Values {
					ts, _ := pt[0].(float64)
					i := int((ts - times[0]) / c.step.Seconds())
					v, err := strconv.ParseFloat(fmt.Sprint(pt[1]), 64)
					// NaN (a quantile of no observations) and ±Inf are gaps, as Grafana draws them.
					if i >= 0 && i < len(times) && err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
						s.Values[i] = &v
					}
				}
				dp.Series = append(dp.Series, s)
			}
		}
		sort.Slice(dp.Series, func(i, j int) bool { return dp.Series[i].Label < dp.Series[j].Label })
		return dp, nil
	default:
		return dp, fmt.Errorf("panel %q: type %q is not drawn (row, stat, timeseries)", p.Title, p.Type)
	}
}

// legend applies Grafana's {{label}} legend format, or names the series by its labels.
func legend(format string, labels map[string]string) string {
	if format != "" {
		out := format
		for k, v := range labels {
			out = strings.ReplaceAll(out, "{{"+k+"}}", v)
			out = strings.ReplaceAll(out, "{{ "+k+" }}", v)
		}
		return out
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		if k != "__name__" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+labels[k])
	}
	if len(parts) == 0 {
		return "value"
	}
	return strings.Join(parts, ", ")
}

func format(v float64, unit string) string {
	switch unit {
	case "percentunit":
		return strconv.FormatFloat(v*100, 'f', 1, 64) + "%"
	case "s":
		return strconv.FormatFloat(v, 'g', 3, 64) + " s"
	}
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// promClient reads Prometheus's HTTP API (v1).
type promClient struct {
	base string
	http *http.Client
}

type result struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

func (p *promClient) get(ctx context.Context, path string, q url.Values, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	res, err := p.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %d: %w", path, res.StatusCode, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %s: %s", path, q.Get("query"), body.Error)
	}
	return json.Unmarshal(body.Data, into)
}

func (p *promClient) query(ctx context.Context, path string, q url.Values) ([]result, error) {
	var data struct {
		ResultType string   `json:"resultType"`
		Result     []result `json:"result"`
	}
	if err := p.get(ctx, path, q, &data); err != nil {
		return nil, err
	}
	return data.Result, nil
}

func (p *promClient) version(ctx context.Context) (string, error) {
	var info struct {
		Version string `json:"version"`
	}
	if err := p.get(ctx, "/api/v1/status/buildinfo", nil, &info); err != nil {
		return "", fmt.Errorf("prometheus at %s: %w", p.base, err)
	}
	return info.Version, nil
}
