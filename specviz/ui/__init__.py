"""The Gradio app's pieces: the three tabs, plots, token rendering, the step-through lesson."""
