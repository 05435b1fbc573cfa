package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // resolves the router's typed_config
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/policy"
)

// readBootstrap parses deploy/envoy/envoy.yaml as Envoy does: into its
// bootstrap type, every typed_config resolved, unknown fields refused,
// and validated by the constraints of Envoy's own protos.
func readBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy v3 bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	return &boot
}

// rateLimitSetup is what a test needs of the bootstrap: the rate limit
// filter, the address of the cluster it calls, and the routes.
type rateLimitSetup struct {
	filter  *ratelimitv3.RateLimit
	service string // host:port of the rate limit service's cluster
	routes  []*routev3.Route
}

func rateLimitOf(t *testing.T, boot *bootstrapv3.Bootstrap) rateLimitSetup {
	t.Helper()
	var s rateLimitSetup
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var rl ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&rl) == nil {
						s.filter = &rl
					}
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					s.routes = append(s.routes, vh.GetRoutes()...)
				}
			}
		}
	}
	if s.filter == nil {
		t.Fatal("envoy.yaml has no envoy.filters.http.ratelimit filter")
	}
	cluster := s.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	for _, c := range boot.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		var opts upstreamhttpv3.HttpProtocolOptions
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil ||
			opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", cluster)
		}
		sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		s.service = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	if s.service == "" {
		t.Fatalf("the rate limit filter calls cluster %q, which envoy.yaml does not define", cluster)
	}
	return s
}

// descriptors returns the descriptors Envoy sends for a request of client
// on route: one per rate_limits entry, one entry per action. An action
// this test does not know fails it, so that the example never grows one
// untested.
func descriptors(t *testing.T, route *routev3.Route, client string) []*ratelimitcommonv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitcommonv3.RateLimitDescriptor
	for _, rl := range route.GetRoute().GetRateLimits() {
		d := &ratelimitcommonv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			var e ratelimitcommonv3.RateLimitDescriptor_Entry
			switch {
			case a.GetGenericKey() != nil:
				e.Key, e.Value = "generic_key", a.GetGenericKey().GetDescriptorValue()
				if k := a.GetGenericKey().GetDescriptorKey(); k != "" {
					e.Key = k
				}
			case a.GetRemoteAddress() != nil:
				e.Key, e.Value = "remote_address", client
			default:
				t.Fatalf("route %s: action %v is not one this test sends", route.GetMatch(), a)
			}
			d.Entries = append(d.Entries, &e)
		}
		out = append(out, d)
	}
	return out
}

// TestEnvoyBootstrap: deploy/envoy/envoy.yaml is a valid Envoy bootstrap
// whose rate limit filter calls sluice's gRPC listener (docs/decision-service.md's
// 127.0.0.1:8081) in the domain of deploy/envoy/rules, within sluice's
// deadline; sluice, run with those rules, limits every descriptor its
// routes produce, as Envoy sends them.
func TestEnvoyBootstrap(t *testing.T) {
	t.Parallel()
	setup := rateLimitOf(t, readBootstrap(t))
	if setup.service != "127.0.0.1:8081" {
		t.Errorf("the rate limit service is at %s, not docs/decision-service.md's SLUICE_RLS_LISTEN=127.0.0.1:8081", setup.service)
	}
	if d := setup.filter.GetTimeout().AsDuration(); d <= 50*time.Millisecond {
		t.Errorf("timeout %v: not above sluice's default SLUICE_DB_TIMEOUT of 50ms", d)
	}
	if setup.filter.GetRateLimitService().GetTransportApiVersion().String() != "V3" || !setup.filter.GetFailureModeDeny() {
		t.Errorf("rate limit service: want transport V3 and failure_mode_deny, got %v", setup.filter)
	}
	rulesFile := filepath.Join(root, "deploy", "envoy", "rules")
	src, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}

	rls := startSluice(t, map[string]string{"SLUICE_RLS_LISTEN": "127.0.0.1:0", "SLUICE_RULES_FILE": rulesFile}).rls
	conn, err := grpc.NewClient(rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	// Each route's calls in one window of the rules' 1m windows.
	pgtest.ClearOf(t, time.Minute, 5*time.Second)
	for i, route := range setup.routes {
		client := fmt.Sprintf("203.0.113.%d", i+1)
		ds := descriptors(t, route, client)
		if len(ds) == 0 {
			t.Errorf("route %s has no rate_limits", route.GetMatch())
			continue
		}
		// The most limited rule of the route decides: its limit of calls
		// are OK, the next is OVER_LIMIT.
		least := int64(-1)
		for _, d := range ds {
			var entries []policy.DescriptorEntry
			for _, e := range d.GetEntries() {
				entries = append(entries, policy.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()})
			}
			rules := pol.MatchDescriptor(setup.filter.GetDomain(), entries, nil)
			if len(rules) == 0 {
				t.Errorf("route %s: descriptor %v matches no rule of deploy/envoy/rules", route.GetMatch(), entries)
			}
			for _, r := range rules {
				if least < 0 || r.Limit < least {
					least = r.Limit
				}
			}
		}
		for n := int64(1); n <= least+1; n++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			res, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: setup.filter.GetDomain(), Descriptors: ds})
			cancel()
			if err != nil {
				t.Fatalf("route %s, call %d: %v", route.GetMatch(), n, err)
			}
			want := rlsv3.RateLimitResponse_OK
			if n > least {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if res.GetOverallCode() != want {
				t.Fatalf("route %s, call %d of a limit of %d: %v, want %v", route.GetMatch(), n, least, res.GetOverallCode(), want)
			}
			for j, st := range res.GetStatuses() {
				if st.GetCurrentLimit() == nil {
					t.Errorf("route %s, descriptor %d: no current_limit: no rule counted it", route.GetMatch(), j)
				}
			}
		}
	}
}
