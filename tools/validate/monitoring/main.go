// Command polycorn-monitoring-validate checks the Prometheus Operator objects
// (monitoring.coreos.com/v1 ServiceMonitor and PrometheusRule) in
// Kubernetes YAML streams, offline.
//
//	polycorn-monitoring-validate [-rules-out DIR] FILE...
//
// kubernetes-validate ships no schemas for custom resources, so kubeconform
// cannot check these kinds; instead each object is decoded strictly into the
// Prometheus Operator's own Go types (github.com/prometheus-operator/
// prometheus-operator/pkg/apis/monitoring): an unknown field anywhere, or a
// value of the wrong type, is an error. On top of that it checks what the
// CRD's OpenAPI schema requires and the decoder cannot see: durations in the
// operator's format, relabeling actions, a port or targetPort per endpoint,
// every rule being exactly one of alert/record with an expression, group
// names unique. With -rules-out, every PrometheusRule's spec is written as
// a Prometheus rules file DIR/<name>.rules.yml, for `promtool check rules`
// (which parses each PromQL expression).
//
// A file holding no such object is an error unless -allow-none is given, so
// a disabled flag cannot make the check pass vacuously by accident.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	yamlv3 "gopkg.in/yaml.v3"
	"sigs.k8s.io/yaml"
)

// The CRD's pattern of monitoringv1.Duration.
var durationRe = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

// The CRD's enum of relabeling actions (either case is accepted).
var relabelActions = map[string]bool{
	"replace": true, "keep": true, "drop": true, "hashmod": true, "labelmap": true,
	"labeldrop": true, "labelkeep": true, "lowercase": true, "uppercase": true,
	"keepequal": true, "dropequal": true,
}

var labelNameRe = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

func main() {
	rulesOut := flag.String("rules-out", "", "write each PrometheusRule's groups to DIR/<name>.rules.yml")
	allowNone := flag.Bool("allow-none", false, "a file without ServiceMonitor/PrometheusRule is not an error")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintf(os.Stderr, "usage: %s [-rules-out DIR] [-allow-none] FILE...\n", os.Args[0])
		os.Exit(2)
	}
	counts := map[string]int{}
	failed := 0
	for _, path := range flag.Args() {
		n, errs := checkFile(path, *rulesOut, counts)
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", path, e)
		}
		if len(errs) > 0 {
			failed++
		} else if n == 0 && !*allowNone {
			fmt.Fprintf(os.Stderr, "FAIL %s: no ServiceMonitor or PrometheusRule in it\n", path)
			failed++
		}
	}
	fmt.Printf("monitoring objects: %d ServiceMonitor, %d PrometheusRule checked; %d file(s) failed\n",
		counts["ServiceMonitor"], counts["PrometheusRule"], failed)
	if failed > 0 {
		os.Exit(1)
	}
}

func checkFile(path, rulesOut string, counts map[string]int) (int, []error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, []error{err}
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var errs []error
	n := 0
	for {
		var node yamlv3.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, append(errs, fmt.Errorf("YAML: %w", err))
		}
		raw, err := yamlv3.Marshal(&node)
		if err != nil {
			return n, append(errs, err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(raw, &head); err != nil || head.Kind == "" {
			continue
		}
		if !strings.HasPrefix(head.APIVersion, "monitoring.coreos.com/") {
			continue
		}
		where := fmt.Sprintf("%s %s", head.Kind, head.Metadata.Name)
		if head.APIVersion != "monitoring.coreos.com/v1" {
			errs = append(errs, fmt.Errorf("%s: apiVersion %s is not checked by this validator", where, head.APIVersion))
			continue
		}
		var problems []string
		switch head.Kind {
		case "ServiceMonitor":
			var sm monitoringv1.ServiceMonitor
			if err := yaml.UnmarshalStrict(raw, &sm); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			problems = checkServiceMonitor(&sm)
		case "PrometheusRule":
			var pr monitoringv1.PrometheusRule
			if err := yaml.UnmarshalStrict(raw, &pr); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			problems = checkPrometheusRule(&pr)
			if len(problems) == 0 && rulesOut != "" {
				if err := writeRules(rulesOut, &pr); err != nil {
					problems = append(problems, err.Error())
				}
			}
		default:
			errs = append(errs, fmt.Errorf("%s: kind not checked by this validator", where))
			continue
		}
		n++
		counts[head.Kind]++
		for _, p := range problems {
			errs = append(errs, fmt.Errorf("%s: %s", where, p))
		}
	}
	return n, errs
}

func checkDuration(problems *[]string, field string, d *monitoringv1.Duration) {
	if d != nil && !durationRe.MatchString(string(*d)) {
		*problems = append(*problems, fmt.Sprintf("%s: %q is not a duration (e.g. 30s, 1m)", field, *d))
	}
}

func checkServiceMonitor(sm *monitoringv1.ServiceMonitor) []string {
	var p []string
	if len(sm.Spec.Endpoints) == 0 {
		p = append(p, "spec.endpoints: at least one endpoint is needed")
	}
	if len(sm.Spec.Selector.MatchLabels) == 0 && len(sm.Spec.Selector.MatchExpressions) == 0 {
		p = append(p, "spec.selector: empty, it would select every Service")
	}
	for i, ep := range sm.Spec.Endpoints {
		at := fmt.Sprintf("spec.endpoints[%d]", i)
		if ep.Port == "" && ep.TargetPort == nil {
			p = append(p, at+": port or targetPort is required")
		}
		if ep.Path != "" && !strings.HasPrefix(ep.Path, "/") {
			p = append(p, at+".path: must start with /")
		}
		checkDuration(&p, at+".interval", &ep.Interval)
		checkDuration(&p, at+".scrapeTimeout", &ep.ScrapeTimeout)
		for j, r := range ep.RelabelConfigs {
			rat := fmt.Sprintf("%s.relabelings[%d]", at, j)
			if r.Action != "" && !relabelActions[strings.ToLower(r.Action)] {
				p = append(p, fmt.Sprintf("%s.action: unknown action %q", rat, r.Action))
			}
			if r.TargetLabel != "" && !labelNameRe.MatchString(r.TargetLabel) && !strings.Contains(r.TargetLabel, "$") {
				p = append(p, fmt.Sprintf("%s.targetLabel: %q is not a label name", rat, r.TargetLabel))
			}
			if r.Regex != "" {
				if _, err := regexp.Compile("^(?:" + r.Regex + ")$"); err != nil {
					p = append(p, fmt.Sprintf("%s.regex: %v", rat, err))
				}
			}
			for _, s := range r.SourceLabels {
				if !labelNameRe.MatchString(string(s)) {
					p = append(p, fmt.Sprintf("%s.sourceLabels: %q is not a label name", rat, s))
				}
			}
		}
	}
	return p
}

func checkPrometheusRule(pr *monitoringv1.PrometheusRule) []string {
	var p []string
	if len(pr.Spec.Groups) == 0 {
		p = append(p, "spec.groups: empty")
	}
	seen := map[string]bool{}
	for i, g := range pr.Spec.Groups {
		at := fmt.Sprintf("spec.groups[%d]", i)
		if g.Name == "" {
			p = append(p, at+".name: required")
		}
		if seen[g.Name] {
			p = append(p, fmt.Sprintf("%s.name: group %q twice", at, g.Name))
		}
		seen[g.Name] = true
		checkDuration(&p, at+".interval", g.Interval)
		if len(g.Rules) == 0 {
			p = append(p, at+".rules: empty")
		}
		for j, r := range g.Rules {
			rat := fmt.Sprintf("%s.rules[%d]", at, j)
			if (r.Alert == "") == (r.Record == "") {
				p = append(p, rat+": exactly one of alert and record is required")
			}
			if r.Expr.String() == "" {
				p = append(p, rat+".expr: required")
			}
			checkDuration(&p, rat+".for", r.For)
			checkDuration(&p, rat+".keep_firing_for", (*monitoringv1.Duration)(r.KeepFiringFor))
		}
	}
	return p
}

// writeRules writes the groups as a Prometheus rules file for promtool.
func writeRules(dir string, pr *monitoringv1.PrometheusRule) error {
	body, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, pr.Name+".rules.yml"), body, 0o644)
}
