package deploy

import (
	"net/url"
	"path/filepath"
	"slices"
	"testing"
)

// TestTraefikForwardAuth checks deploy/traefik/dynamic.yml as far as it
// can without Traefik, which Debian does not package (docs/decision-service.md says the
// snippet is not run): a forwardAuth middleware that asks sluice's check
// listener at the documented address without trusting the client's
// forwarding headers, used by a router in front of the application.
func TestTraefikForwardAuth(t *testing.T) {
	var dyn struct {
		HTTP struct {
			Middlewares map[string]struct {
				ForwardAuth *struct {
					Address            string `json:"address"`
					TrustForwardHeader bool   `json:"trustForwardHeader"`
				} `json:"forwardAuth"`
			} `json:"middlewares"`
			Routers map[string]struct {
				Rule        string   `json:"rule"`
				Middlewares []string `json:"middlewares"`
				Service     string   `json:"service"`
			} `json:"routers"`
			Services map[string]struct {
				LoadBalancer struct {
					Servers []struct {
						URL string `json:"url"`
					} `json:"servers"`
				} `json:"loadBalancer"`
			} `json:"services"`
		} `json:"http"`
	}
	readYAML(t, filepath.Join(root, "deploy", "traefik", "dynamic.yml"), &dyn)
	fa := dyn.HTTP.Middlewares["sluice"].ForwardAuth
	if fa == nil {
		t.Fatal("no forwardAuth middleware named sluice")
	}
	if u, err := url.Parse(fa.Address); err != nil || u.Host != exampleCheck || fa.TrustForwardHeader {
		t.Errorf("forwardAuth: address %q (want sluice's check listener %s), trustForwardHeader %v (want false)", fa.Address, exampleCheck, fa.TrustForwardHeader)
	}
	if len(dyn.HTTP.Routers) == 0 {
		t.Fatal("no router")
	}
	for name, r := range dyn.HTTP.Routers {
		if !slices.Contains(r.Middlewares, "sluice") {
			t.Errorf("router %s does not ask sluice", name)
		}
		servers := dyn.HTTP.Services[r.Service].LoadBalancer.Servers
		if len(servers) != 1 || servers[0].URL != "http://"+exampleApp {
			t.Errorf("router %s: service %q has servers %v, want the documented application", name, r.Service, servers)
		}
	}
}
