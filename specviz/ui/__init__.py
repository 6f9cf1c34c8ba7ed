"""The Gradio app's pieces: one module per tab (race, check, step, watch), what they share (common), the race's
logic, plots, token rendering and the step-through lesson."""
