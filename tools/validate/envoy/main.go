// Command polycorn-envoy-validate checks Envoy bootstrap configurations
// offline against Envoy's own protobuf schemas (go-control-plane), since no
// Envoy binary can be installed here to run `envoy --mode validate`.
//
//	polycorn-envoy-validate [-configmap-key envoy.yaml] FILE...
//
// Each FILE is either an Envoy bootstrap (YAML or JSON) or a multi-document
// YAML stream of Kubernetes objects (`helm template` output), from which the
// bootstrap is taken out of every ConfigMap that has the key given by
// -configmap-key. A file holding no bootstrap at all is an error, so a
// renamed key cannot make the check pass vacuously.
//
// A bootstrap is checked in three steps:
//  1. YAML to JSON, then protojson.Unmarshal into
//     envoy.config.bootstrap.v3.Bootstrap: unknown fields, wrong types and
//     unknown enum values are errors (DiscardUnknown is false);
//  2. ValidateAll() on the Bootstrap: every protoc-gen-validate rule
//     (required fields, ranges, lengths, oneofs);
//  3. every google.protobuf.Any inside it (typed_config of listener, network
//     and HTTP filters, transport sockets, ...) is unpacked, at any depth, and
//     ValidateAll()'d in turn, because step 2 does not descend into an Any.
//     An Any whose type is not linked into this binary is an error: the
//     extensions the chart uses are blank-imported in extensions.go;
//  4. references (references.go): unique names and addresses (per
//     protocol), clusters named by TCP proxies, UDP proxies and routes
//     exist, UDP proxies sit on UDP listeners, no two filter chains of a
//     listener with the same match: what Envoy rejects at load time.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	yamlv3 "gopkg.in/yaml.v3"
	"sigs.k8s.io/yaml"
)

// validator is what protoc-gen-validate generates on every message.
type validator interface{ ValidateAll() error }

// bootstrap is one configuration found in an input, with where it came from.
type bootstrap struct {
	where string
	body  []byte
}

func main() {
	key := flag.String("configmap-key", "envoy.yaml", "ConfigMap data key holding the Envoy bootstrap")
	quiet := flag.Bool("q", false, "print only errors")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [-configmap-key KEY] [-q] FILE...\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	failed := 0
	total := 0
	for _, path := range flag.Args() {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", path, err)
			failed++
			continue
		}
		found, err := extract(path, data, *key)
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", path, err)
			failed++
			continue
		}
		for _, b := range found {
			total++
			n, err := validate(b.body)
			if err != nil {
				fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", b.where, err)
				failed++
				continue
			}
			if !*quiet {
				fmt.Printf("ok   %s (%d typed_config/Any messages validated)\n", b.where, n)
			}
		}
	}
	fmt.Printf("envoy bootstraps: %d checked, %d failed\n", total, failed)
	if failed > 0 {
		os.Exit(1)
	}
}

// extract returns the bootstraps in one file: the file itself if it is a
// bootstrap, else the key of every ConfigMap in a Kubernetes YAML stream.
func extract(path string, data []byte, key string) ([]bootstrap, error) {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var out []bootstrap
	docs := 0
	sawK8s := false
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("YAML: %w", err)
		}
		docs++
		if doc == nil {
			continue
		}
		kind, isK8s := doc["kind"].(string)
		if _, ok := doc["apiVersion"]; !ok || !isK8s {
			continue
		}
		sawK8s = true
		if kind != "ConfigMap" {
			continue
		}
		dataMap, _ := doc["data"].(map[string]any)
		body, ok := dataMap[key].(string)
		if !ok {
			continue
		}
		name := "?"
		if md, ok := doc["metadata"].(map[string]any); ok {
			if s, ok := md["name"].(string); ok {
				name = s
			}
		}
		out = append(out, bootstrap{where: fmt.Sprintf("%s: ConfigMap %s key %s", path, name, key), body: []byte(body)})
	}
	if !sawK8s {
		if docs != 1 {
			return nil, fmt.Errorf("not a bootstrap (%d YAML documents) and no Kubernetes objects", docs)
		}
		return []bootstrap{{where: path, body: data}}, nil
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no ConfigMap with data key %q (the Envoy bootstrap) among the Kubernetes objects", key)
	}
	return out, nil
}

// validate checks one bootstrap; it returns how many Any messages it unpacked.
func validate(body []byte) (int, error) {
	js, err := yaml.YAMLToJSON(body)
	if err != nil {
		return 0, fmt.Errorf("YAML to JSON: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		return 0, fmt.Errorf("bootstrap v3: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return 0, fmt.Errorf("bootstrap v3 rules: %w", err)
	}
	var errs []string
	n := walk(b.ProtoReflect(), "bootstrap", &errs)
	errs = append(errs, references(&b)...)
	if len(errs) > 0 {
		return n, errors.New(strings.Join(errs, "; "))
	}
	return n, nil
}

// walk visits every message under m; each Any is unpacked, validated and
// walked in turn. It returns the number of Any messages seen.
func walk(m protoreflect.Message, at string, errs *[]string) int {
	n := 0
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			if errors.Is(err, protoregistry.NotFound) {
				*errs = append(*errs, fmt.Sprintf("%s: type %s is not linked into the validator (blank-import its package in extensions.go)", at, a.GetTypeUrl()))
			} else {
				*errs = append(*errs, fmt.Sprintf("%s: %s: %v", at, a.GetTypeUrl(), err))
			}
			return 1
		}
		if v, ok := inner.(validator); ok {
			if err := v.ValidateAll(); err != nil {
				*errs = append(*errs, fmt.Sprintf("%s (%s): %v", at, a.GetTypeUrl(), err))
			}
		}
		return 1 + walk(inner.ProtoReflect(), at+"<"+string(proto.MessageName(inner))+">", errs)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := at + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				n += walk(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), errs)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				n += walk(mv.Message(), fmt.Sprintf("%s[%v]", name, k.Interface()), errs)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			n += walk(v.Message(), name, errs)
		}
		return true
	})
	return n
}
