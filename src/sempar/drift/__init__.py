"""Traffic drift: streams whose mix changes, replay of re-placement policies over them."""
