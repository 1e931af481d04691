package main

import (
	"fmt"
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// layoutColors tell the layouts apart in the plot, in report order.
var layoutColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// ratioPoints are a layout's sites: x the site's place, y its median
// ratio, the error bar its min–max over the pairs.
type ratioPoints struct {
	plotter.XYs
	plotter.YErrors
}

// writePlot draws each site's ratio to bare Caddy (median of the pairs,
// bar from the lowest to the highest pair), one colour per layout, the
// peer's sites as triangles beside ours, into a PNG (or SVG, by path's
// extension) at path.
func writePlot(path string, rep *report) error {
	var names []string
	seen := map[string]bool{}
	for _, l := range rep.Layouts {
		for _, s := range l.Sites {
			if s.Ratio != nil && !seen[s.Site] {
				seen[s.Site] = true
				names = append(names, s.Site)
			}
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("plot %s: no site has a ratio", path)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Ratio to bare Caddy: median of %d pairs, bars from the lowest to the highest (%s)", rep.Config.Pairs, rep.Machine.Date)
	p.Y.Label.Text = "site req/s ÷ bare Caddy req/s"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = draw.XRight
	// Ratios sit between about 0.3 and 1: the legend goes below them,
	// and the axis reaches past 1, the bare Caddy.
	p.Legend.Left = true
	p.Y.Max = 1.1
	width := 0.6 / float64(max(len(rep.Layouts), 1))
	for li, l := range rep.Layouts {
		col := layoutColors[li%len(layoutColors)]
		off := (float64(li) - float64(len(rep.Layouts)-1)/2) * width
		for _, peer := range []bool{false, true} {
			var pts ratioPoints
			for i, name := range names {
				for _, s := range l.Sites {
					if s.Site == name && s.Ratio != nil && strings.HasPrefix(name, "peer_") == peer {
						r := s.Ratio
						p.Y.Max = max(p.Y.Max, r.Max*1.05)
						pts.XYs = append(pts.XYs, plotter.XY{X: float64(i) + off, Y: r.Median})
						pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{r.Median - r.Min, r.Max - r.Median})
					}
				}
			}
			if len(pts.XYs) == 0 {
				continue
			}
			name := l.Name
			if l.Harness != "" && l.Harness != "bench" {
				name += ", " + l.Harness
			}
			if err := addRatios(p, pts, col, peer, name); err != nil {
				return err
			}
		}
	}
	return p.Save(vg.Length(max(8, len(names)))*vg.Inch, 5*vg.Inch, path)
}

// addRatios adds one series: its points, their error bars, a legend entry.
func addRatios(p *plot.Plot, pts ratioPoints, col color.Color, peer bool, layout string) error {
	sc, err := plotter.NewScatter(pts.XYs)
	if err != nil {
		return err
	}
	sc.Color, sc.Radius = col, vg.Points(4)
	sc.Shape = draw.CircleGlyph{}
	name := "sliding_ratelimit, " + layout
	if peer {
		sc.Shape = draw.TriangleGlyph{}
		sc.Radius = vg.Points(5)
		name = "mholt/caddy-ratelimit, " + layout
	}
	eb, err := plotter.NewYErrorBars(pts)
	if err != nil {
		return err
	}
	eb.Color = col
	p.Add(eb, sc)
	p.Legend.Add(name, sc)
	return nil
}
