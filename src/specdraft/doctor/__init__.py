"""``specdraft doctor``: find the silent causes of low acceptance in a drafter before serving it."""
