package main

import (
	"fmt"

	matcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	udpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/udp/udp_proxy/v3"
	"google.golang.org/protobuf/proto"
)

// references checks what Envoy itself rejects when it loads a static
// bootstrap but protoc-gen-validate rules cannot express: names that must be
// unique, clusters that routes, TCP proxies and UDP proxies name, listeners
// sharing an address and protocol (a TCP and a UDP listener may share a
// port), a UDP proxy on a listener that is not UDP (Envoy: a UDP listener
// filter needs a UDP listener), and filter chains of one listener with the
// same match (Envoy: "multiple filter chains with the same matching rules
// are defined").
func references(b *bootstrapv3.Bootstrap) []string {
	var errs []string
	sr := b.GetStaticResources()
	clusters := map[string]bool{}
	for _, c := range sr.GetClusters() {
		if clusters[c.GetName()] {
			errs = append(errs, fmt.Sprintf("cluster %q defined twice", c.GetName()))
		}
		clusters[c.GetName()] = true
		if la := c.GetLoadAssignment(); la != nil && la.GetClusterName() != c.GetName() {
			errs = append(errs, fmt.Sprintf("cluster %q: load_assignment.cluster_name is %q", c.GetName(), la.GetClusterName()))
		}
	}
	listeners := map[string]bool{}
	addresses := map[string]string{}
	for _, l := range sr.GetListeners() {
		if listeners[l.GetName()] {
			errs = append(errs, fmt.Sprintf("listener %q defined twice", l.GetName()))
		}
		listeners[l.GetName()] = true
		sa := l.GetAddress().GetSocketAddress()
		addr := fmt.Sprintf("%s %s:%d", sa.GetProtocol(), sa.GetAddress(), sa.GetPortValue())
		if other, ok := addresses[addr]; ok {
			errs = append(errs, fmt.Sprintf("listeners %q and %q both bind %s", other, l.GetName(), addr))
		}
		addresses[addr] = l.GetName()
		if b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue() == sa.GetPortValue() && sa.GetPortValue() != 0 {
			errs = append(errs, fmt.Sprintf("listener %q binds the admin port %d", l.GetName(), sa.GetPortValue()))
		}
		udp := sa.GetProtocol() == corev3.SocketAddress_UDP
		for _, f := range l.GetListenerFilters() {
			at := fmt.Sprintf("listener %q listener filter %s", l.GetName(), f.GetName())
			a := f.GetTypedConfig()
			if a == nil {
				continue
			}
			m, err := a.UnmarshalNew()
			if err != nil {
				continue // reported by the Any walker
			}
			cfg, ok := m.(*udpproxyv3.UdpProxyConfig)
			if !ok {
				continue
			}
			if !udp {
				errs = append(errs, fmt.Sprintf("%s: a UDP proxy on a %s listener (socket_address.protocol must be UDP)", at, sa.GetProtocol()))
			}
			for _, c := range udpProxyClusters(cfg) {
				if !clusters[c] {
					errs = append(errs, fmt.Sprintf("%s: cluster %q is not defined", at, c))
				}
			}
		}
		chains := l.GetFilterChains()
		for i, fc := range chains {
			for j := 0; j < i; j++ {
				if proto.Equal(fc.GetFilterChainMatch(), chains[j].GetFilterChainMatch()) {
					errs = append(errs, fmt.Sprintf("listener %q: filter chains %d and %d have the same filter_chain_match", l.GetName(), j, i))
				}
			}
			for _, f := range fc.GetFilters() {
				at := fmt.Sprintf("listener %q filter chain %d filter %s", l.GetName(), i, f.GetName())
				a := f.GetTypedConfig()
				if a == nil {
					continue
				}
				m, err := a.UnmarshalNew()
				if err != nil {
					continue // reported by the Any walker
				}
				switch cfg := m.(type) {
				case *tcpproxyv3.TcpProxy:
					if c := cfg.GetCluster(); c != "" && !clusters[c] {
						errs = append(errs, fmt.Sprintf("%s: cluster %q is not defined", at, c))
					}
					for _, w := range cfg.GetWeightedClusters().GetClusters() {
						if !clusters[w.GetName()] {
							errs = append(errs, fmt.Sprintf("%s: cluster %q is not defined", at, w.GetName()))
						}
					}
				case *hcmv3.HttpConnectionManager:
					for _, vh := range cfg.GetRouteConfig().GetVirtualHosts() {
						for _, r := range vh.GetRoutes() {
							if c := r.GetRoute().GetCluster(); c != "" && !clusters[c] {
								errs = append(errs, fmt.Sprintf("%s: route of virtual host %q: cluster %q is not defined", at, vh.GetName(), c))
							}
						}
					}
				}
			}
		}
	}
	return errs
}

// udpProxyClusters are the clusters a UDP proxy sends to: its (deprecated)
// cluster field, or the udp_proxy Route actions of its matcher, each match
// and on_no_match at any depth.
func udpProxyClusters(cfg *udpproxyv3.UdpProxyConfig) []string {
	if c := cfg.GetCluster(); c != "" {
		return []string{c}
	}
	var out []string
	var onMatch func(om *matcherv3.Matcher_OnMatch)
	var tree func(m *matcherv3.Matcher)
	onMatch = func(om *matcherv3.Matcher_OnMatch) {
		if om == nil {
			return
		}
		if om.GetMatcher() != nil {
			tree(om.GetMatcher())
			return
		}
		a := om.GetAction().GetTypedConfig()
		if a == nil {
			return
		}
		if m, err := a.UnmarshalNew(); err == nil {
			if r, ok := m.(*udpproxyv3.Route); ok {
				out = append(out, r.GetCluster())
			}
		}
	}
	tree = func(m *matcherv3.Matcher) {
		if m == nil {
			return
		}
		for _, fm := range m.GetMatcherList().GetMatchers() {
			onMatch(fm.GetOnMatch())
		}
		for _, om := range m.GetMatcherTree().GetExactMatchMap().GetMap() {
			onMatch(om)
		}
		for _, om := range m.GetMatcherTree().GetPrefixMatchMap().GetMap() {
			onMatch(om)
		}
		onMatch(m.GetOnNoMatch())
	}
	tree(cfg.GetMatcher())
	return out
}
